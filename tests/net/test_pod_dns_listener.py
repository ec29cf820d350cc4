"""The Kubernetes runtime's shared DNS listener (``PodDnsServer``) starts on an address the
host does not have yet and answers once the address appears: a node's Pod bridge, which a
server outside the cluster listens on, gets its address only with the node's first Pod.
Runs in a fresh process in a network namespace of its own (``unshare --net``); the
documentation address exists only there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import asyncio, socket, struct, subprocess
    from dnslib import RCODE, DNSRecord
    from sandlot.net.dns import DnsFilter
    from sandlot.net.policy import parse_policy
    from sandlot.runtime.kubernetes.dnsfilter import PodDnsServer

    LATE = "198.51.100.53"
    asked = []

    async def filter_of(source):
        asked.append(source)
        return DnsFilter("t", parse_policy({"defaultAction": "deny"}), [], None)

    def udp_query(name):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(DNSRecord.question(name).pack(), (LATE, 53))
            return DNSRecord.parse(s.recv(4096))

    def tcp_query(name):
        with socket.create_connection((LATE, 53), timeout=5) as s:
            data = DNSRecord.question(name).pack()
            s.sendall(struct.pack("!H", len(data)) + data)
            size = struct.unpack("!H", s.recv(2))[0]
            body = b""
            while len(body) < size:
                body += s.recv(size - len(body))
            return DNSRecord.parse(body)

    async def main():
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        late = PodDnsServer(filter_of)
        assert await late.start(LATE, 53) is False  # not on any interface yet: still listens
        here = PodDnsServer(filter_of)
        assert await here.start("127.0.0.1", 5353) is True
        subprocess.run(["ip", "addr", "add", LATE + "/32", "dev", "lo"], check=True)
        loop = asyncio.get_running_loop()
        by_udp = await loop.run_in_executor(None, udp_query, "denied.test")
        by_tcp = await loop.run_in_executor(None, tcp_query, "denied.test")
        assert by_udp.header.rcode == RCODE.NXDOMAIN, by_udp
        assert by_tcp.header.rcode == RCODE.NXDOMAIN, by_tcp
        assert asked == [LATE, LATE], asked  # each told by its source address
        late.close()
        here.close()
        print("ok")

    asyncio.run(main())
''')


def test_listens_on_an_address_that_appears_later() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a namespace of its own")
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", SCRIPT],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
