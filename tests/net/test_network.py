"""Issue 12's acceptance: outbound access, default deny, the egress policy and its APIs.

Everything runs in namespaces the tests create (``conftest.py``): the sandboxes' traffic can
only reach the test hosts at 198.51.100.0/24 and the metadata stand-in.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
from opensandbox import Sandbox
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from sandlot.net import firewall
from sandlot.runtime.oci.layout import netns_name
from tests.compat.conftest import COMPAT_IMAGE
from tests.net.conftest import NetServer
from tests.net.testhosts import (
    BIG_FILE_MIB,
    DENIED_HOST,
    HOST,
    METADATA,
    MIRROR,
    PRIVATE,
    SERVER_UPLINK,
)

DENY_POLICY = NetworkPolicy(
    defaultAction="deny",
    egress=[NetworkRule(action="allow", target="allowed.test"),
            NetworkRule(action="allow", target="*.wild.test")],
)


async def sh(sandbox: Sandbox, cmd: str) -> tuple[int, str]:
    ex = await sandbox.commands.run(cmd)
    # One message per line, terminator stripped (the reference execd's framing).
    out = "\n".join([m.text for m in ex.logs.stdout] + [m.text for m in ex.logs.stderr])
    code = ex.exit_code if ex.exit_code is not None else (1 if ex.error else 0)
    return code, out


async def fetch(sandbox: Sandbox, url: str) -> tuple[int, str]:
    return await sh(sandbox, f"curl -sS --max-time 5 {url}")


async def resolves(sandbox: Sandbox, name: str) -> bool:
    code, _ = await sh(sandbox, f"python3 -c 'import socket; socket.gethostbyname(\"{name}\")'")
    return code == 0


async def create(server: NetServer, policy: NetworkPolicy | None = None, proxy: bool = False
                 ) -> Sandbox:
    return await Sandbox.create(
        COMPAT_IMAGE, connection_config=server.sdk_config(proxy=proxy),
        network_policy=policy, timeout=timedelta(minutes=15),
        ready_timeout=timedelta(seconds=90))


def container_ids(server: NetServer) -> set[str]:
    d = server.data_dir / "sandboxes"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


async def test_default_policy_reaches_test_host_and_nothing_private(
        net_server: NetServer) -> None:
    a = await create(net_server)
    b = await create(net_server)
    host_srv = subprocess.Popen(  # a service on the server's host addresses and loopback
        [sys.executable, "-m", "http.server", "18999", "--bind", "0.0.0.0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    try:
        code, out = await fetch(a, "http://allowed.test/hello.txt")
        assert code == 0 and "hello from the test host" in out, out
        code, out = await fetch(a, f"http://{HOST}/hello.txt")
        assert code == 0 and "hello from the test host" in out, out
        code, out = await sh(a, "curl -sS --max-time 120 -o /dev/null -w '%{size_download}' "
                                f"http://{HOST}/big.bin")
        assert code == 0 and out.strip() == str(BIG_FILE_MIB << 20), out

        code, resolv = await sh(a, "cat /etc/resolv.conf")
        gateway = resolv.split("nameserver", 1)[1].split()[0]
        assert gateway.startswith("100.88.")
        # DNS over TCP (resolvers fall back to it for large answers) is filtered the same.
        tcp_query = ("python3 -c 'import socket,struct; q=struct.pack(\">HHHHHH\",7,256,1,0,0,0)"
                     "+b\"\".join(bytes([len(p)])+p.encode() "
                     "for p in \"allowed.test\".split(\".\"))"
                     "+b\"\\0\"+struct.pack(\">HH\",1,1); "
                     f"s=socket.create_connection((\"{gateway}\",53),3); "
                     "s.sendall(struct.pack(\">H\",len(q))+q); "
                     "n=struct.unpack(\">H\",s.recv(2))[0]; r=s.recv(n); "
                     "print(r[3]&15, r[-4:]==socket.inet_aton(\"198.51.100.10\"))'")
        code, out = await sh(a, tcp_query)
        assert code == 0 and out.split() == ["0", "True"], out
        code, out = await sh(a, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
        assert out.strip() == "1"  # IPv6 off inside: fc00::/7, fe80::/10 unreachable
        code, hostname = await sh(a, "cat /etc/hostname")
        assert hostname.strip() == a.id[:63]

        code, out = await fetch(a, f"http://{METADATA}/latest/meta-data")
        assert code != 0 and "metadata stand-in" not in out
        # A private address is denied unless the operator's allow_cidrs names it.
        code, out = await fetch(a, f"http://{MIRROR}/hello.txt")
        assert code == 0 and "hello" in out, out
        code, out = await fetch(a, f"http://{PRIVATE}/hello.txt")
        assert code != 0 and "hello" not in out, out
        for addr in ("127.0.0.1", SERVER_UPLINK, gateway):
            code, out = await fetch(a, f"http://{addr}:18999/")
            assert code != 0 and "Directory listing" not in out, (addr, out)
        host_ok = subprocess.run(["curl", "-sS", "--max-time", "5", "http://127.0.0.1:18999/"],
                                 capture_output=True, text=True)
        assert "Directory listing" in host_ok.stdout  # the service is there for the host

        # Another sandbox's service is unreachable, but reachable through both endpoints.
        await b.commands.run("cd /tmp && echo sandbox-b > b.txt && "
                             "python3 -m http.server 8000 --bind 0.0.0.0",
                             opts=RunCommandOpts(background=True))
        _, b_resolv = await sh(b, "cat /etc/resolv.conf")
        b_gw = b_resolv.split("nameserver", 1)[1].split()[0]
        b_addr = b_gw.rsplit(".", 1)[0] + "." + str(int(b_gw.rsplit(".", 1)[1]) + 1)
        deadline = time.monotonic() + 20
        while (await sh(b, "curl -sS --max-time 2 http://127.0.0.1:8000/b.txt"))[0] != 0:
            assert time.monotonic() < deadline, "http.server in sandbox b did not start"
            await asyncio.sleep(0.3)
        code, out = await fetch(a, f"http://{b_addr}:8000/b.txt")
        assert code != 0 and "sandbox-b" not in out, out

        ep = await b.get_endpoint(8000)
        hdrs = dict(ep.headers or {})
        r = httpx.get(f"http://{ep.endpoint}/b.txt", headers=hdrs, timeout=10)
        assert r.text.strip() == "sandbox-b"
        proxied = await Sandbox.connect(b.id, connection_config=net_server.sdk_config(proxy=True))
        try:
            pep = await proxied.get_endpoint(8000)
            r = httpx.get(f"http://{pep.endpoint}/b.txt",
                          headers={**dict(pep.headers or {}),
                                   "OPEN-SANDBOX-API-KEY": net_server.api_key}, timeout=10)
            assert r.text.strip() == "sandbox-b"
            # http.server redirects /tmpdir to /tmpdir/: the proxy rebases it onto its route.
            await sh(b, "mkdir -p /tmp/sub")
            r = httpx.get(f"http://{pep.endpoint}/sub",
                          headers={"OPEN-SANDBOX-API-KEY": net_server.api_key}, timeout=10)
            assert r.status_code == 301
            assert r.headers["location"].endswith(f"/sandboxes/{b.id}/proxy/8000/sub/")
        finally:
            await proxied.close()
    finally:
        host_srv.terminate()
        host_srv.wait(10)
        for s in (a, b):
            await s.kill()
            await s.close()


def osb(server: NetServer, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("osb", path=str(Path(sys.executable).parent)) or "osb"
    return subprocess.run([exe, "--config", str(server.data_dir / "osb-none.toml"), *args],
                          env=server.env(), capture_output=True, text=True, timeout=120)


async def assert_deny_policy_holds(sandbox: Sandbox) -> None:
    code, out = await fetch(sandbox, "http://allowed.test/hello.txt")
    assert code == 0 and "hello" in out, out
    assert await resolves(sandbox, "a.wild.test")
    assert not await resolves(sandbox, "denied.test")
    code, out = await fetch(sandbox, f"http://{DENIED_HOST}/hello.txt")
    assert code != 0 and "hello" not in out, out


async def test_deny_policy_wildcards_patch_delete_restart(net_server: NetServer) -> None:
    sandbox = await create(net_server, DENY_POLICY)
    try:
        await assert_deny_policy_holds(sandbox)
        code, out = await fetch(sandbox, "http://a.wild.test/hello.txt")
        assert code == 0 and "hello" in out, out
        assert not await resolves(sandbox, "wild.test")  # *.x does not match x itself

        policy = await sandbox.get_egress_policy()
        assert policy.default_action == "deny"
        assert [(r.action, r.target) for r in policy.egress] == [
            ("allow", "allowed.test"), ("allow", "*.wild.test")]

        # PATCH through the SDK's egress methods: in force at once.
        await sandbox.patch_egress_rules([NetworkRule(action="allow", target="denied.test")])
        code, out = await fetch(sandbox, "http://denied.test/hello.txt")
        assert code == 0 and "hello" in out, out

        # osb egress get/patch
        p = osb(net_server, "egress", "get", sandbox.id, "-o", "json")
        assert p.returncode == 0, p.stderr
        assert "denied.test" in p.stdout
        p = osb(net_server, "egress", "patch", sandbox.id, "--rule", "deny=a.wild.test",
                "-o", "json")
        assert p.returncode == 0, p.stdout + p.stderr
        assert not await resolves(sandbox, "a.wild.test")
        assert await resolves(sandbox, "b.wild.test")

        # DELETE removes a rule: denied again (name and the address it had resolved to).
        await sandbox.delete_egress_rules(["denied.test", "a.wild.test"])
        assert not await resolves(sandbox, "denied.test")
        code, _ = await fetch(sandbox, f"http://{DENIED_HOST}/hello.txt")
        assert code != 0
        assert await resolves(sandbox, "a.wild.test")

        # The lifecycle routes see and change the same policy; invalid rules name the rule.
        with net_server.client() as c:
            got = c.get(f"/v1/sandboxes/{sandbox.id}/networkpolicy").json()
            assert got["policy"]["egress"] == [{"action": "allow", "target": "allowed.test"},
                                               {"action": "allow", "target": "*.wild.test"}]
            assert got["mode"] == "enforcing" and got["enforcementMode"] == "dns+nft"
            # Each change through the egress API is a diagnostics event.
            events = c.get(f"/v1/sandboxes/{sandbox.id}/diagnostics/events",
                           params={"scope": "runtime"}).json()["content"]
            assert "PolicyChanged Egress policy set: default deny, 2 rule(s)" in events
            bad = c.patch(f"/v1/sandboxes/{sandbox.id}/networkpolicy",
                          json=[{"action": "allow", "target": "ok.test"},
                                {"action": "allow", "target": "no spaces!"}])
            assert bad.status_code == 400 and "rules[1]" in bad.json()["message"]
            bad = c.post("/v1/sandboxes", json={
                "image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
                "timeout": 600, "resourceLimits": {},
                "networkPolicy": {"defaultAction": "block"}})
            assert bad.status_code == 400 and "defaultAction" in bad.json()["message"]

        # The policy holds across pause/resume and a kill -9 restart of the server.
        await sandbox.pause()
        resumed = await Sandbox.resume(sandbox.id, connection_config=net_server.sdk_config())
        try:
            await assert_deny_policy_holds(resumed)
        finally:
            await resumed.close()
        net_server.kill9()
        net_server.start()
        again = await Sandbox.connect(sandbox.id, connection_config=net_server.sdk_config())
        try:
            await assert_deny_policy_holds(again)
            policy = await again.get_egress_policy()
            assert [r.target for r in policy.egress] == ["allowed.test", "*.wild.test"]
        finally:
            await again.close()
    finally:
        await sandbox.kill()
        await sandbox.close()


async def test_egress_api_needs_its_header(net_server: NetServer) -> None:
    sandbox = await create(net_server, DENY_POLICY)
    try:
        ep = await sandbox.get_endpoint(18080)
        assert "OPENSANDBOX-EGRESS-AUTH" in (ep.headers or {})
        url = f"http://{ep.endpoint}/policy"
        assert httpx.get(url, timeout=10).status_code == 401
        r = httpx.get(url, headers=dict(ep.headers or {}), timeout=10)
        assert r.status_code == 200 and r.json()["mode"] == "enforcing"
        r = httpx.patch(url, headers=dict(ep.headers or {}), timeout=10,
                        json=[{"action": "allow", "target": "bad target"}])
        assert r.status_code == 400 and "bad target" in r.text
        r = httpx.get(f"http://{ep.endpoint}/credential-vault", headers=dict(ep.headers or {}),
                      timeout=10)
        assert r.status_code == 501
        # The same API through the server proxy (the SDK's use_server_proxy).
        proxied = f"{net_server.url}/v1/sandboxes/{sandbox.id}/proxy/18080/policy"
        r = httpx.get(proxied, headers={**dict(ep.headers or {}),
                                        "OPEN-SANDBOX-API-KEY": net_server.api_key}, timeout=10)
        assert r.status_code == 200 and r.json()["policy"]["defaultAction"] == "deny"
        r = httpx.get(proxied, headers={"OPEN-SANDBOX-API-KEY": net_server.api_key}, timeout=10)
        assert r.status_code == 401
        # An IP/CIDR rule changes the addresses the sandbox may reach, at once, both ways.
        code, _ = await fetch(sandbox, f"http://{DENIED_HOST}/hello.txt")
        assert code != 0
        r = httpx.patch(url, headers=dict(ep.headers or {}), timeout=10,
                        json=[{"action": "allow", "target": f"{DENIED_HOST}/32"}])
        assert r.status_code == 200, r.text
        code, out = await fetch(sandbox, f"http://{DENIED_HOST}/hello.txt")
        assert code == 0 and "hello" in out, out
        r = httpx.request("DELETE", url, headers=dict(ep.headers or {}), timeout=10,
                          json=[f"{DENIED_HOST}/32"])
        assert r.status_code == 200, r.text
        code, _ = await fetch(sandbox, f"http://{DENIED_HOST}/hello.txt")
        assert code != 0
    finally:
        await sandbox.kill()
        await sandbox.close()


async def test_root_in_sandbox_cannot_change_rules_or_spoof(net_server: NetServer) -> None:
    sandbox = await create(net_server, DENY_POLICY)
    try:
        code, out = await sh(sandbox, "grep CapEff /proc/self/status")
        cap_eff = int(out.split()[1], 16)
        assert not cap_eff & (1 << 12), "CAP_NET_ADMIN held"  # nft, iptables, ip route
        assert not cap_eff & (1 << 13), "CAP_NET_RAW held"
        code, out = await sh(sandbox, "echo 0 > /proc/sys/net/ipv4/ip_forward")
        assert code != 0
        code, out = await sh(sandbox, "python3 -c 'import socket; socket.socket("
                                      "socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)'")
        assert code != 0 and "Operation not permitted" in out
        # A route change over netlink is refused (what `ip route` would send).
        code, out = await sh(sandbox, "python3 -c 'import socket,struct; "
                                      "s=socket.socket(socket.AF_NETLINK,socket.SOCK_RAW,0); "
                                      "body=struct.pack(\"BBBBBBBBI\",2,0,0,0,254,3,0,1,0); "
                                      "h=struct.pack(\"IHHII\",16+len(body),24,0x405,1,0); "
                                      "s.send(h+body); r=s.recv(4096); "
                                      "print(struct.unpack(\"i\",r[16:20])[0])'")
        assert code == 0 and out.strip() in ("-1", "-13"), out  # -EPERM / -EACCES
        # Spoofing: a socket bound to a foreign source (IP_FREEBIND) gets nowhere.
        code, out = await sh(sandbox, "python3 -c 'import socket; "
                                      "s=socket.socket(); s.setsockopt(socket.SOL_IP,15,1); "
                                      f"s.bind((\"{HOST}\",0)); s.settimeout(3); "
                                      f"s.connect((\"{HOST}\",80))'")
        assert code != 0
    finally:
        await sandbox.kill()
        await sandbox.close()


# A WebSocket echo server with only the standard library (the image has no websockets
# package): the handshake, then one text/binary frame back for each frame received.
WS_ECHO = r'''
import base64, hashlib, socket, struct, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    f = c.makefile("rb")
    key = None
    while (line := f.readline().strip()):
        k, _, v = line.decode().partition(":")
        if k.lower() == "sec-websocket-key":
            key = v.strip()
    acc = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
    while True:
        h = f.read(2)
        if len(h) < 2: return
        op, n = h[0] & 15, h[1] & 127
        if n == 126: n = struct.unpack(">H", f.read(2))[0]
        elif n == 127: n = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4) if h[1] & 128 else b"\0\0\0\0"
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8: c.sendall(b"\x88\x00"); return
        hdr = bytes([0x80 | op]) + (bytes([n]) if n < 126 else b"\x7e" + struct.pack(">H", n))
        c.sendall(hdr + data)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8765)); s.listen()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
'''


async def test_websocket_server_in_sandbox_through_both_endpoints(net_server: NetServer) -> None:
    from opensandbox.models.filesystem import WriteEntry
    from websockets.sync.client import connect as ws_connect

    sandbox = await create(net_server)
    try:
        await sandbox.files.write_files([WriteEntry(path="/tmp/ws_echo.py", data=WS_ECHO)])
        await sandbox.commands.run("python3 /tmp/ws_echo.py",
                                   opts=RunCommandOpts(background=True))
        ep = await sandbox.get_endpoint(8765)
        deadline = time.monotonic() + 20
        while True:
            try:
                ws = ws_connect(f"ws://{ep.endpoint}/", open_timeout=5)
                break
            except (OSError, Exception):  # noqa: BLE001 - not listening yet
                assert time.monotonic() < deadline, "the echo server did not start"
                await asyncio.sleep(0.3)
        with ws:
            ws.send("direct hello")
            assert ws.recv(timeout=10) == "direct hello"
        proxied = f"ws://{net_server.domain}/v1/sandboxes/{sandbox.id}/proxy/8765/"
        with ws_connect(proxied, additional_headers={"OPEN-SANDBOX-API-KEY":
                                                     net_server.api_key}) as ws:
            ws.send("proxied hello")
            assert ws.recv(timeout=10) == "proxied hello"
    finally:
        await sandbox.kill()
        await sandbox.close()


def test_nothing_left_behind(net_server: NetServer) -> None:
    """Last: every sandbox deleted, the pool drained: no veth, chain, table, lease, namespace."""
    ids = container_ids(net_server)
    net_server.delete_all_sandboxes()
    net_server.stop()  # drains the warm pool
    # Looked at by fresh processes: they start in this thread's namespace (the server's).
    ip_links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert "up0" in ip_links and "slv" not in ip_links, ip_links
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "sandlot" not in tables and firewall.LEGACY_PREFIX not in tables, tables
    assert not list((net_server.data_dir / "net" / "leases").iterdir())
    for cid in ids:
        assert not os.path.exists(f"/run/netns/{netns_name(cid)}"), cid
    net_server.start()  # destroy() expects a running server
