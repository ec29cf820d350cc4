"""Test hosts in network namespaces the tests create; nothing touches the machine's own.

Topology (``<p>`` is a per-run prefix):

    <p>s (the server's namespace)          <p>h (the test hosts' namespace)
    up0 198.51.100.2/24  ---- veth ----    up0 198.51.100.10, .20, .30 /24
    default via 198.51.100.10              lo 169.254.169.254/32 (the metadata stand-in),
                                           10.99.0.1, 10.99.0.2 (private hosts)

In ``<p>h``: an HTTP server on port 80 of every address (so each answers with its own
address in ``/whoami``-style files is not needed: the path names the host) and a DNS server
for the test zone on 198.51.100.10:53. Enter namespaces with ``nsenter --net=``: ``ip netns
exec`` remounts /sys and hides the cgroup mounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOST = "198.51.100.10"
DENIED_HOST = "198.51.100.20"
WILD_HOST = "198.51.100.30"
SERVER_UPLINK = "198.51.100.2"
METADATA = "169.254.169.254"
# Private addresses on the test hosts (inside the test namespaces only): an operator's
# allow_cidrs entry opens the first, the default deny keeps the second closed.
MIRROR = "10.99.0.1"
PRIVATE = "10.99.0.2"
ZONE = {"allowed.test": HOST, "denied.test": DENIED_HOST, "a.wild.test": WILD_HOST,
        "b.wild.test": WILD_HOST}
BIG_FILE_MIB = 100
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

DNS_SERVER = r'''
import socket, sys
from dnslib import A, QTYPE, RCODE, RR, DNSRecord
zone = dict(a.split("=") for a in sys.argv[2:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
while True:
    data, peer = s.recvfrom(4096)
    try:
        q = DNSRecord.parse(data)
    except Exception:
        continue
    name = str(q.q.qname).rstrip(".").lower()
    r = q.reply()
    if name in zone:
        if q.q.qtype == QTYPE.A:
            r.add_answer(RR(q.q.qname, QTYPE.A, rdata=A(zone[name]), ttl=30))
    else:
        r.header.rcode = RCODE.NXDOMAIN
    s.sendto(r.pack(), peer)
'''


# ``python -m http.server`` listens with a backlog of 5 (socketserver's default): a burst of
# 1000 connections (the fan-out bench row) overflowed it (ListenOverflows in the hosts'
# namespace) and SYNs retried past the clients' timeouts. A test host must not be the limit.
HTTP_SERVER = r'''
import functools, http.server, sys
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 4096
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
Server((sys.argv[1], 80), functools.partial(Quiet, directory=sys.argv[2])).serve_forever()
'''


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def nsenter(ns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


@dataclass
class TestNet:
    prefix: str
    server_ns: str
    hosts_ns: str
    workdir: Path
    procs: list[subprocess.Popen[bytes]]

    def run_in_server_ns(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(nsenter(self.server_ns, *args), capture_output=True, text=True,
                              timeout=timeout)


def _wait_port(ns: str, host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    probe = f"import socket; socket.create_connection(({host!r}, {port}), 1).close()"
    while time.monotonic() < deadline:
        if subprocess.run(nsenter(ns, sys.executable, "-c", probe),
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{host}:{port} in {ns} did not come up")


@contextlib.contextmanager
def test_network(workdir: Path) -> Iterator[TestNet]:
    """Build the topology and its servers; remove all of it afterwards."""
    prefix = "sltn" + secrets.token_hex(3)
    srv, hosts = prefix + "s", prefix + "h"
    net = TestNet(prefix, srv, hosts, workdir, [])
    try:
        sh("ip", "netns", "add", srv)
        sh("ip", "netns", "add", hosts)
        sh("ip", "link", "add", "up0", "netns", srv, "type", "veth", "peer", "name", "up0",
           "netns", hosts)
        for ns in (srv, hosts):
            sh(*nsenter(ns, "ip", "link", "set", "lo", "up"))
            sh(*nsenter(ns, "ip", "link", "set", "up0", "up"))
        sh(*nsenter(srv, "ip", "addr", "add", f"{SERVER_UPLINK}/24", "dev", "up0"))
        sh(*nsenter(srv, "ip", "route", "add", "default", "via", HOST))
        for a in (HOST, DENIED_HOST, WILD_HOST):
            sh(*nsenter(hosts, "ip", "addr", "add", f"{a}/24", "dev", "up0"))
        sh(*nsenter(hosts, "ip", "addr", "add", f"{METADATA}/32", "dev", "lo"))
        for a in (MIRROR, PRIVATE):
            sh(*nsenter(hosts, "ip", "addr", "add", f"{a}/32", "dev", "lo"))
        sh(*nsenter(srv, "ip", "route", "add", "10.99.0.0/24", "via", HOST))
        www = workdir / "www"
        www.mkdir(parents=True, exist_ok=True)
        (www / "hello.txt").write_text("hello from the test host\n")
        with open(www / "big.bin", "wb") as fh:
            fh.truncate(BIG_FILE_MIB << 20)
        (www / "latest").mkdir(exist_ok=True)
        (www / "latest" / "meta-data").write_text("metadata stand-in\n")
        net.procs.append(subprocess.Popen(
            nsenter(hosts, sys.executable, "-c", HTTP_SERVER, "0.0.0.0", str(www)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        net.procs.append(subprocess.Popen(
            nsenter(hosts, sys.executable, "-c", DNS_SERVER, HOST,
                    *(f"{k}={v}" for k, v in ZONE.items())),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_port(hosts, HOST, 80)
        yield net
    finally:
        for p in net.procs:
            p.terminate()
        for p in net.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        for ns in (srv, hosts):
            sh("ip", "netns", "delete", ns, check=False)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def thread_in_netns(ns: str) -> Iterator[None]:
    """Move the calling thread into namespace ``ns`` (sockets it makes, and processes and
    threads it starts, live there) and back afterwards."""
    home = open(f"/proc/self/task/{threading.get_native_id()}/ns/net")  # noqa: SIM115
    try:
        with open(f"/run/netns/{ns}") as target:
            _setns(target.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())
    finally:
        home.close()
