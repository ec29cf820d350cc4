"""The DNS filter: each sandbox's resolver, answering only names its policy permits.

One UDP and TCP listener per sandbox on its gateway address, port 53, in the server's
namespace (the workload reaches nothing else on the host). A denied name gets NXDOMAIN (and
a log line naming the rule or the default that denied it); a permitted query is forwarded
as is to the upstream resolvers (positive answers are kept per sandbox for their smallest
TTL; identical queries arriving while one is upstream share its answer), and in ``dns+nft``
mode the A records of the answer go into the sandbox's nft allow set for their TTL *before*
the answer is sent, so the connection that follows finds its address allowed. Packets are
parsed and built with dnslib.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from dnslib import QTYPE, RCODE, DNSRecord

from sandlot.net.policy import ALLOW, EgressPolicy

log = logging.getLogger(__name__)
UPSTREAM_TIMEOUT = 3.0
Learn = Callable[[str, list[tuple[ipaddress.IPv4Address, int]]], Awaitable[None]]


def host_resolvers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    servers: list[str] = []
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    servers.append(str(ipaddress.ip_address(parts[1].split("%")[0])))
    return servers


class _Reply(asyncio.DatagramProtocol):
    def __init__(self, answer: asyncio.Future[bytes]) -> None:
        self.answer = answer

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.answer.done():
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


async def forward(query: bytes, upstreams: list[str]) -> bytes | None:
    """Ask the upstreams in turn; the first answer wins."""
    loop = asyncio.get_running_loop()
    for server in upstreams:
        answer: asyncio.Future[bytes] = loop.create_future()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda a=answer: _Reply(a), remote_addr=(server, 53))  # type: ignore[misc]
        except OSError as exc:
            log.debug("dns upstream %s unreachable: %s", server, exc)
            continue
        try:
            transport.sendto(query)
            return await asyncio.wait_for(answer, UPSTREAM_TIMEOUT)
        except (TimeoutError, OSError) as exc:
            log.debug("dns upstream %s failed: %s", server, exc)
        finally:
            transport.close()
    return None


def answered_addresses(reply: DNSRecord) -> list[tuple[ipaddress.IPv4Address, int]]:
    return [(ipaddress.IPv4Address(str(rr.rdata)), int(rr.ttl))
            for rr in reply.rr if rr.rtype == QTYPE.A]


CacheKey = tuple[str, int, int, bool]  # qname as asked, qtype, qclass, EDNS present
CACHE_ENTRIES = 1024  # per sandbox
DENY_LOG_EVERY = 60.0  # seconds between log lines for one denied name


@dataclass
class _Cached:
    expires: float  # time.monotonic()
    raw: bytes
    addresses: list[tuple[ipaddress.IPv4Address, int]]


class DnsFilter(asyncio.DatagramProtocol):
    """The filter of one sandbox (its policy is swapped in place on a change)."""

    def __init__(self, sandbox: str, policy: EgressPolicy, upstreams: list[str],
                 learn: Learn | None) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.upstreams = upstreams
        self.learn = learn  # None: mode dns, addresses are not enforced
        self.transport: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.Server | None = None
        self._cache: dict[CacheKey, _Cached] = {}
        # Upstream questions in flight: identical queries arriving meanwhile wait for the
        # same answer (a burst of 20 connections asks the same name 20 times at once).
        self._inflight: dict[CacheKey, asyncio.Future[bytes | None]] = {}
        self._denied_logged: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not isinstance(asyncio.DatagramTransport): uvloop's transports are not.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        task = asyncio.get_running_loop().create_task(self._answer_udp(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_udp(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = await self.answer(data)
        if reply is not None:
            self._send(reply, addr)

    async def answer(self, data: bytes) -> bytes | None:
        """The reply to one query (None: not a query worth answering)."""
        try:
            request = DNSRecord.parse(data)
        except Exception:  # noqa: BLE001 - dnslib raises several types on garbage
            return None
        if not request.questions:
            return None
        name = str(request.q.qname).rstrip(".").lower()
        action, rule = self.policy.evaluate(name)
        if action != ALLOW:
            self._log_denied(name, f"rule {rule.action} {rule.target}" if rule
                             else "defaultAction deny")
            return _error(request, RCODE.NXDOMAIN)
        key = (str(request.q.qname), request.q.qtype, request.q.qclass, bool(request.ar))
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached.expires > now:
            raw = data[:2] + cached.raw[2:]  # the answer, under this query's id
            left = int(cached.expires - now)
            found = [(ip, left) for ip, _ in cached.addresses]
        else:
            pending = self._inflight.get(key)
            if pending is not None:
                answer = await asyncio.shield(pending)
            else:
                pending = asyncio.get_running_loop().create_future()
                self._inflight[key] = pending
                try:
                    answer = await forward(data, self.upstreams)
                    pending.set_result(answer)
                finally:
                    if not pending.done():
                        pending.set_result(None)
                    self._inflight.pop(key, None)
            if answer is None:
                return _error(request, RCODE.SERVFAIL)
            raw = data[:2] + answer[2:]  # under this query's id (a shared answer has another)
            try:
                reply = DNSRecord.parse(raw)
            except Exception:  # noqa: BLE001 - an upstream's garbage is not passed on
                return _error(request, RCODE.SERVFAIL)
            found = answered_addresses(reply)
            self._remember(key, raw, reply, found, now)
        if self.learn is not None:
            try:
                if found:
                    await self.learn(name, found)
            except Exception:  # noqa: BLE001 - never answer what could not be allowed
                log.exception("dns filter: sandbox %s: cannot allow answers for %s",
                              self.sandbox, name)
                return _error(request, RCODE.SERVFAIL)
        return raw

    def _log_denied(self, name: str, why: str) -> None:
        """One line per denied name and minute: a retrying client must not flood the log."""
        now = time.monotonic()
        if now - self._denied_logged.get(name, -DENY_LOG_EVERY) < DENY_LOG_EVERY:
            return
        if len(self._denied_logged) >= CACHE_ENTRIES:
            self._denied_logged.clear()
        self._denied_logged[name] = now
        log.info("dns filter: sandbox %s: %s denied (%s): NXDOMAIN", self.sandbox, name, why)

    def _remember(self, key: CacheKey, raw: bytes, reply: DNSRecord,
                  found: list[tuple[ipaddress.IPv4Address, int]], now: float) -> None:
        """Keep a positive answer for its smallest TTL (answers repeat a lot: package
        managers resolve the same few hosts over and over)."""
        if reply.header.rcode != RCODE.NOERROR or not reply.rr:
            return
        ttl = min(int(rr.ttl) for rr in reply.rr)
        if ttl <= 0:
            return
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = _Cached(now + ttl, raw, found)

    async def serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> None:
        """DNS over TCP (RFC 1035 4.2.2: each message behind its 2-byte length)."""
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(2), "big")
                reply = await self.answer(await reader.readexactly(size))
                if reply is None:
                    return
                writer.write(len(reply).to_bytes(2, "big") + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _send(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.tcp is not None:
            self.tcp.close()
        for task in self._tasks:
            task.cancel()


def _error(request: DNSRecord, rcode: int) -> bytes:
    reply = request.reply()
    reply.header.rcode = rcode
    return bytes(reply.pack())


async def start_filter(bind: str, flt: DnsFilter) -> DnsFilter:
    """Listen on ``bind``:53, UDP and TCP."""
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(lambda: flt, local_addr=(bind, 53))
    try:
        flt.tcp = await asyncio.start_server(flt.serve_tcp, bind, 53)
    except BaseException:
        flt.close()
        raise
    return flt
