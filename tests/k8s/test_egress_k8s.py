"""Egress policies on the kubernetes runtime: sandlot's DNS filter answers each sandbox Pod
per its policy (told by the query's source Pod IP), a NetworkPolicy per sandbox follows the
policy and the filter's answers, and the server refuses what the cluster cannot enforce.

The sandbox Pods' resolver is the server on the kit's Pod bridge gateway (198.19.0.1:53); the
filter's upstream is a fake DNS server of the test on a loopback address, answering every
name with an address nothing is ever sent to (the kit's Pods reach nothing beyond the node).
The kit's CNI does not enforce NetworkPolicy: the objects' content is what is asserted.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer
from opensandbox import Sandbox
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from tests.compat.conftest import COMPAT_IMAGE, RAW_CREATE_BODY, SandlotServer
from tests.k8s_cluster import Cluster

pytestmark = pytest.mark.timeout(900)
NODE = "198.19.0.1"  # the kit's Pod bridge gateway, the host: where Pods reach the server
UPSTREAM = "127.88.53.1"  # the test's fake upstream resolver (loopback)
ADDRESSES = {"allowed.test": "5.6.7.8", "a.wild.test": "5.6.7.9", "b.wild.test": "5.6.7.10",
             "denied.test": "5.6.7.11"}
OTHER = "5.6.7.99"
DENY_POLICY = NetworkPolicy(
    defaultAction="deny",
    egress=[NetworkRule(action="allow", target="allowed.test"),
            NetworkRule(action="allow", target="*.wild.test"),
            NetworkRule(action="allow", target="9.9.0.0/16"),
            NetworkRule(action="deny", target="9.9.9.0/24")],
)


class _Answers(BaseResolver):  # type: ignore[misc]
    """Every A question answered (TTL 300) with the name's address in ADDRESSES."""

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        if request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ADDRESSES.get(name, OTHER)),
                                ttl=300))
        return reply


@pytest.fixture(scope="module")
def upstream() -> Iterator[None]:
    servers = [DNSServer(_Answers(), address=UPSTREAM, port=53, tcp=tcp) for tcp in (False, True)]
    for s in servers:
        s.start_thread()
    yield
    for s in servers:
        s.stop()


class EgressServer(SandlotServer):
    def __init__(self, image_root: Path, k8s: Cluster) -> None:
        super().__init__(image_root, backend="kubernetes", k8s=k8s)
        # [runtime] is in the file already: its keys go into the section
        self.base_config = self.config.read_text().replace(
            '[runtime]\ntype = "kubernetes"\n', '[runtime]\ntype = "kubernetes"\n'
            f'warm_pool_images = ["{COMPAT_IMAGE}"]\n')

    def configure(self, enforced: bool = True, mode: str = "dns+nft", warm: int = 0,
                  dns_filter: bool = True) -> None:
        """(Re)start with the DNS filter on the bridge gateway and these settings."""
        assert self.k8s is not None
        self.stop()
        self.config.write_text(
            self.base_config
            + (f'dns_filter_address = "{NODE}"\n' if dns_filter else "")
            + f"network_policy_enforced = {str(enforced).lower()}\n"
            + f"warm_pool_size = {warm}\n"
            + f'[network]\ndns_servers = ["{UPSTREAM}"]\n[egress]\nmode = "{mode}"\n')
        self.start()


@pytest.fixture(scope="module")
def server(compat_image_root: Path, k8s_images: Cluster, upstream: None
           ) -> Iterator[EgressServer]:
    srv = EgressServer(compat_image_root, k8s_images)
    srv.configure()
    try:
        yield srv
    finally:
        print(srv.log_tail(200000))  # captured: shown with a failure, nothing left on disk
        srv.destroy()
    left = k8s_images.kubectl("get", "networkpolicies", "-l",
                              "app.kubernetes.io/managed-by=sandlot", "-o", "name").stdout
    assert left.strip() == "", left


def network_policy(cluster: Cluster, sandbox_id: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "networkpolicy", f"sandlot-{sandbox_id}-egress", "-o", "json",
                          check=False)
    if out.returncode != 0:
        assert "NotFound" in out.stderr, out.stderr
        return None
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def allowed_blocks(np: dict[str, Any]) -> dict[str, list[str]]:
    """cidr -> except of the NetworkPolicy's non-DNS egress rule."""
    rules = np["spec"]["egress"]
    assert rules[0] == {"to": [{"ipBlock": {"cidr": f"{NODE}/32"}}],
                        "ports": [{"protocol": "UDP", "port": 53},
                                  {"protocol": "TCP", "port": 53}]}
    if len(rules) == 1:
        return {}
    assert len(rules) == 2
    return {p["ipBlock"]["cidr"]: p["ipBlock"].get("except", []) for p in rules[1]["to"]}


def wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: never true")
        time.sleep(0.3)


async def resolve(sandbox: Sandbox, name: str) -> str | None:
    """The address the sandbox's resolver gives ``name`` (None: not resolved)."""
    ex = await sandbox.commands.run(f"getent ahostsv4 {name} | head -n1")
    out = "".join(m.text for m in ex.logs.stdout).split()
    return out[0] if out else None


async def create(server: SandlotServer, policy: NetworkPolicy | None) -> Sandbox:
    return await Sandbox.create(
        COMPAT_IMAGE, connection_config=server.sdk_config(timeout=120), network_policy=policy,
        resource={"cpu": "250m", "memory": "128Mi"}, timeout=timedelta(minutes=15),
        ready_timeout=timedelta(seconds=240))


def test_deny_policy_dns_filter_and_network_policy(server: EgressServer) -> None:
    cluster = server.k8s
    assert cluster is not None

    async def scenario() -> str:
        sandbox = await create(server, DENY_POLICY)
        try:
            assert await resolve(sandbox, "allowed.test") == ADDRESSES["allowed.test"]
            assert await resolve(sandbox, "a.wild.test") == ADDRESSES["a.wild.test"]
            assert await resolve(sandbox, "wild.test") is None  # *.x is not x
            assert await resolve(sandbox, "denied.test") is None

            np = network_policy(cluster, sandbox.id)
            assert np is not None
            assert np["spec"]["podSelector"]["matchLabels"]["sandlot.io/sandbox-id"] == sandbox.id
            assert np["spec"]["policyTypes"] == ["Egress"]
            assert [r["kind"] for r in np["metadata"]["ownerReferences"]] == ["Pod"]
            blocks = allowed_blocks(np)
            assert blocks == {"9.9.0.0/16": ["9.9.9.0/24"], "5.6.7.8/32": [],
                              "5.6.7.9/32": []}, blocks

            # The SDK's egress methods (port 18080, answered by the server).
            policy = await sandbox.get_egress_policy()
            assert policy.default_action == "deny"
            assert [r.target for r in policy.egress] == [
                "allowed.test", "*.wild.test", "9.9.0.0/16", "9.9.9.0/24"]
            await sandbox.patch_egress_rules([NetworkRule(action="allow", target="denied.test")])
            assert await resolve(sandbox, "denied.test") == ADDRESSES["denied.test"]
            assert "5.6.7.11/32" in allowed_blocks(network_policy(cluster, sandbox.id) or {})
            await sandbox.delete_egress_rules(["denied.test"])
            assert await resolve(sandbox, "denied.test") is None
            # the address it had answered is no longer allowed either
            assert "5.6.7.11/32" not in allowed_blocks(network_policy(cluster, sandbox.id) or {})
            return sandbox.id
        finally:
            await sandbox.close()

    sid = asyncio.run(scenario())

    # kill -9 and restart: the filter answers as before, the NetworkPolicy is kept.
    server.kill9()
    server.start()

    async def after_restart() -> None:
        sandbox = await Sandbox.connect(sid, connection_config=server.sdk_config(timeout=120))
        try:
            assert await resolve(sandbox, "denied.test") is None
            assert await resolve(sandbox, "b.wild.test") == ADDRESSES["b.wild.test"]
            blocks = allowed_blocks(network_policy(cluster, sid) or {})
            assert {"5.6.7.8/32", "5.6.7.10/32", "9.9.0.0/16"} <= set(blocks), blocks
        finally:
            await sandbox.close()

    asyncio.run(after_restart())

    with server.client() as c:
        # The lifecycle route: default allow with a denied block -> everything but the block.
        r = c.put(f"/v1/sandboxes/{sid}/networkpolicy",
                  json={"defaultAction": "allow",
                        "egress": [{"action": "deny", "target": "8.8.0.0/16"},
                                   {"action": "deny", "target": "denied.test"}]})
        assert r.status_code == 200, r.text
        assert r.json()["policy"]["defaultAction"] == "allow"
        assert allowed_blocks(network_policy(cluster, sid) or {}) == {
            "0.0.0.0/0": ["8.8.0.0/16"]}
        # Allow-all needs no NetworkPolicy: it goes.
        r = c.put(f"/v1/sandboxes/{sid}/networkpolicy", json={"defaultAction": "allow"})
        assert r.status_code == 200, r.text
        assert network_policy(cluster, sid) is None
        got = c.get(f"/v1/sandboxes/{sid}/networkpolicy").json()
        assert got["policy"] == {"defaultAction": "allow", "egress": []}
        # A policy again, then the sandbox goes: its NetworkPolicy with it.
        r = c.patch(f"/v1/sandboxes/{sid}/networkpolicy",
                    json=[{"action": "deny", "target": "9.9.9.9"}])
        assert r.status_code == 200, r.text
        assert allowed_blocks(network_policy(cluster, sid) or {}) == {
            "0.0.0.0/0": ["9.9.9.9/32"]}
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        wait_for(lambda: network_policy(cluster, sid) is None, "NetworkPolicy deleted")


def test_sandbox_without_policy_resolves_through_the_filter_and_can_get_one(
        server: EgressServer) -> None:
    cluster = server.k8s
    assert cluster is not None

    async def scenario() -> None:
        sandbox = await create(server, None)
        try:
            assert await resolve(sandbox, "anything.example") == OTHER
            assert network_policy(cluster, sandbox.id) is None
            pod = json.loads(cluster.kubectl("get", "pod", f"sandlot-{sandbox.id}", "-o",
                                             "json").stdout)
            assert pod["spec"]["dnsPolicy"] == "None"
            assert pod["spec"]["dnsConfig"]["nameservers"] == [NODE]
            # a policy given later is in force at once (no restart of the Pod)
            await sandbox.patch_egress_rules([NetworkRule(action="deny", target="*.example")])
            assert await resolve(sandbox, "anything.example") is None
            assert await resolve(sandbox, "allowed.test") == ADDRESSES["allowed.test"]
            assert network_policy(cluster, sandbox.id) is None  # default allow, no block
            await sandbox.kill()
        finally:
            await sandbox.close()

    asyncio.run(scenario())


def test_queries_from_elsewhere_are_refused(server: EgressServer) -> None:
    query = DNSRecord.question("allowed.test").pack()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(query, (NODE, 53))  # from the host itself: no sandbox's Pod
        reply = DNSRecord.parse(sock.recv(4096))
    assert reply.header.rcode == RCODE.REFUSED
    assert not reply.rr


def test_address_deny_refused_unless_enforced_or_dns_only(server: EgressServer) -> None:
    cluster = server.k8s
    assert cluster is not None
    server.configure(enforced=False)
    with server.client() as c:
        body = {**RAW_CREATE_BODY, "networkPolicy": {
            "defaultAction": "deny", "egress": [{"action": "allow", "target": "allowed.test"}]}}
        r = c.post("/v1/sandboxes", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "SANDBOX::INVALID_PARAMETER"
        assert "network_policy_enforced = true" in r.json()["message"]
        assert '[egress] mode = "dns"' in r.json()["message"]
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, "networkPolicy": {
            "defaultAction": "allow", "egress": [{"action": "deny", "target": "1.2.3.0/24"}]}})
        assert r.status_code == 400, r.text
        # names only: fine on any cluster
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, "networkPolicy": {
            "defaultAction": "allow", "egress": [{"action": "deny", "target": "denied.test"}]}})
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Running",
                 "Running", timeout=240)
        # a change to an address deny is refused the same way, and nothing changes
        r = c.put(f"/v1/sandboxes/{sid}/networkpolicy", json={"defaultAction": "deny"})
        assert r.status_code == 400 and "network_policy_enforced" in r.json()["message"]
        assert c.get(f"/v1/sandboxes/{sid}/networkpolicy").json()["policy"]["defaultAction"] \
            == "allow"
        assert network_policy(cluster, sid) is None
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204

    # DNS-only filtering accepted by the operator: the deny policy is taken, names are
    # filtered, no NetworkPolicy is written.
    server.configure(enforced=False, mode="dns")

    async def dns_only() -> None:
        sandbox = await create(server, DENY_POLICY)
        try:
            assert await resolve(sandbox, "allowed.test") == ADDRESSES["allowed.test"]
            assert await resolve(sandbox, "denied.test") is None
            assert network_policy(cluster, sandbox.id) is None
            policy = await sandbox.get_egress_policy()
            assert policy.default_action == "deny"
            await sandbox.kill()
        finally:
            await sandbox.close()

    asyncio.run(dns_only())
    server.configure()


def test_a_claimed_warm_pod_resolves_through_the_filter(server: EgressServer) -> None:
    """A create without a policy claims a warm Pod (relabelled): the filter knows it at once,
    and a policy given later holds for it (its NetworkPolicy selects it by the new label)."""
    cluster = server.k8s
    assert cluster is not None
    server.configure(warm=1)

    def warm_running() -> bool:
        out = cluster.kubectl("get", "pods", "-l", "sandlot.io/warm=true", "-o",
                              "jsonpath={.items[*].status.phase}").stdout
        return "Running" in out

    async def scenario() -> None:
        wait_for(warm_running, "a warm Pod runs", timeout=240)
        time.sleep(1)  # execd's first answer marks it ready
        sandbox = await Sandbox.create(  # the default shape: the warm Pod's
            COMPAT_IMAGE, connection_config=server.sdk_config(timeout=120),
            timeout=timedelta(minutes=15), ready_timeout=timedelta(seconds=240))
        try:
            pods = json.loads(cluster.kubectl("get", "pods", "-l",
                                              f"sandlot.io/sandbox-id={sandbox.id}", "-o",
                                              "json").stdout)["items"]
            assert pods[0]["metadata"]["name"].startswith("sandlot-warm-"), pods
            assert await resolve(sandbox, "allowed.test") == ADDRESSES["allowed.test"]
            await sandbox.patch_egress_rules([NetworkRule(action="deny", target="*.test")])
            assert await resolve(sandbox, "allowed.test") is None
            with server.client() as c:
                r = c.put(f"/v1/sandboxes/{sandbox.id}/networkpolicy", json={
                    "defaultAction": "deny",
                    "egress": [{"action": "allow", "target": "allowed.test"}]})
                assert r.status_code == 200, r.text
            assert await resolve(sandbox, "allowed.test") == ADDRESSES["allowed.test"]
            name = pods[0]["metadata"]["name"]
            np = json.loads(cluster.kubectl("get", "networkpolicy", f"{name}-egress", "-o",
                                            "json").stdout)
            assert np["spec"]["podSelector"]["matchLabels"]["sandlot.io/sandbox-id"] \
                == sandbox.id
            assert "5.6.7.8/32" in allowed_blocks(np)
            await sandbox.kill()
        finally:
            await sandbox.close()

    try:
        asyncio.run(scenario())
    finally:
        server.configure()


def test_a_pod_made_before_the_filter_cannot_take_a_policy(server: EgressServer) -> None:
    """A sandbox created while no DNS filter was configured resolves with the cluster's DNS:
    a policy for it is refused (409) rather than pretended; allow-all is accepted."""
    server.configure(dns_filter=False)
    try:
        with server.client() as c:
            r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, "networkPolicy": {
                "defaultAction": "allow", "egress": [{"action": "deny", "target": "x.test"}]}})
            assert r.status_code == 400 and "dns_filter_address" in r.json()["message"], r.text
            r = c.post("/v1/sandboxes", json=RAW_CREATE_BODY)
            assert r.status_code == 202, r.text
            sid = r.json()["id"]
            wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").json()["status"]["state"]
                     == "Running", "Running", timeout=240)
        server.configure()
        with server.client() as c:
            r = c.put(f"/v1/sandboxes/{sid}/networkpolicy", json={"defaultAction": "deny"})
            assert r.status_code == 409, r.text
            assert "created before [kubernetes] dns_filter_address" in r.json()["message"]
            r = c.put(f"/v1/sandboxes/{sid}/networkpolicy", json={"defaultAction": "allow"})
            assert r.status_code == 200, r.text
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        server.configure()
