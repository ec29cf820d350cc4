"""The DNS filter against a real (slow) upstream over UDP: a burst of identical queries goes
upstream once and every asker gets the answer under its own query id. Runs in a fresh
process in a network namespace of its own (``unshare --net``): the upstream listens on that
namespace's loopback, nothing touches the machine's own."""

from __future__ import annotations

import textwrap

from tests.net.own_netns import run_in_own_netns

SCRIPT = textwrap.dedent('''
    import asyncio, subprocess
    from dnslib import A, QTYPE, RCODE, RR, DNSRecord
    from sandlot.net.dns import DnsFilter
    from sandlot.net.policy import parse_policy

    asked = []

    class Upstream(asyncio.DatagramProtocol):
        """Answers after 0.3 s: long enough for a burst to arrive while one is upstream."""
        def connection_made(self, transport):
            self.transport = transport

        def datagram_received(self, data, addr):
            q = DNSRecord.parse(data)
            asked.append((str(q.q.qname), q.q.qtype))
            r = q.reply()
            if q.q.qtype == QTYPE.A:
                r.add_answer(RR(q.q.qname, QTYPE.A, rdata=A("198.51.100.10"), ttl=30))
            asyncio.get_running_loop().call_later(0.3, self.transport.sendto, r.pack(), addr)

    async def main():
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(Upstream, local_addr=("127.0.0.1", 53))
        policy = parse_policy({"defaultAction": "deny",
                               "egress": [{"action": "allow", "target": "allowed.test"}]})
        flt = DnsFilter("t", policy, ["127.0.0.1"], None)
        queries = [DNSRecord.question("allowed.test", "A") for _ in range(20)]
        queries += [DNSRecord.question("allowed.test", "AAAA") for _ in range(20)]
        replies = await asyncio.gather(*(flt.answer(bytes(q.pack())) for q in queries))
        once_each = [("allowed.test.", QTYPE.A), ("allowed.test.", QTYPE.AAAA)]
        assert sorted(asked) == once_each, asked  # 40 queries, 2 upstream questions
        for q, raw in zip(queries, replies):
            r = DNSRecord.parse(raw)
            assert r.header.id == q.header.id, (r.header.id, q.header.id)
            assert r.header.rcode == RCODE.NOERROR
            if q.q.qtype == QTYPE.A:
                assert [str(rr.rdata) for rr in r.rr] == ["198.51.100.10"], r
            else:
                assert r.rr == [], r
        # The positive answer is cached now; the empty AAAA answer (no TTL) is not.
        again = DNSRecord.question("allowed.test", "A")
        r = DNSRecord.parse(await flt.answer(bytes(again.pack())))
        assert r.header.id == again.header.id and len(asked) == 2, asked
        denied = DNSRecord.parse(await flt.answer(bytes(DNSRecord.question("denied.test").pack())))
        assert denied.header.rcode == RCODE.NXDOMAIN and len(asked) == 2, asked
        print("ok")

    asyncio.run(main())
''')


def test_identical_queries_in_flight_share_one_upstream_question() -> None:
    run_in_own_netns(SCRIPT)
