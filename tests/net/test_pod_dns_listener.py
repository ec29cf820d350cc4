"""The Kubernetes runtime's shared DNS listener (``PodDnsServer``) starts on an address the
host does not have yet and answers once the address appears: a node's Pod bridge, which a
server outside the cluster listens on, gets its address only with the node's first Pod.
Runs in a fresh process in a network namespace of its own (``unshare --net``); the
documentation address exists only there."""

from __future__ import annotations

import textwrap

from tests.net.own_netns import run_in_own_netns

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


EGRESS_SCRIPT = textwrap.dedent('''
    import asyncio, logging, subprocess
    from types import SimpleNamespace
    from kubernetes_asyncio import client
    from sandlot.config import Config
    from sandlot.runtime.kubernetes.egress import PodEgress

    LATE = "198.51.100.54"
    records = []
    logger = logging.getLogger("sandlot.runtime.kubernetes.egress")
    logger.setLevel(logging.INFO)
    logger.addHandler(
        type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r)})())

    def pod(ip):
        return SimpleNamespace(metadata=SimpleNamespace(name="p", annotations={},
                                                        deletion_timestamp=None),
                               status=SimpleNamespace(pod_ip=ip))

    async def lookup(ip):
        return None

    async def main():
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        cfg = Config.model_validate({"server": {"api_key": "k"},
                                     "runtime": {"type": "kubernetes"},
                                     "egress": {"mode": "dns"},
                                     "kubernetes": {"dns_filter_address": LATE}})
        async with client.ApiClient() as api:
            egress = PodEgress(cfg, api, "o", lambda sid: {}, lookup)
            await egress.start()  # no cluster call in mode dns
            assert egress.listen_address_absent
            egress.note("ADDED", "sbx-1", pod("198.51.100.99"))  # still absent: an error
            assert egress.listen_address_absent
            assert [r.levelname for r in records if r.levelno >= logging.WARNING] == \
                ["WARNING", "ERROR"], records
            subprocess.run(["ip", "addr", "add", LATE + "/32", "dev", "lo"], check=True)
            egress.note("MODIFIED", "sbx-1", pod("198.51.100.99"))
            assert not egress.listen_address_absent
            assert records[-1].levelname == "INFO" and "on an interface now" in \
                records[-1].getMessage(), records
            await egress.close()
        print("ok")

    asyncio.run(main())
''')


def test_listens_on_an_address_that_appears_later() -> None:
    run_in_own_netns(SCRIPT)


def test_egress_reports_when_the_listen_address_appears() -> None:
    """The runtime's egress part: a warning at start, an error when sandbox Pods run and
    the address is still absent, a note once it is there."""
    run_in_own_netns(EGRESS_SCRIPT)
