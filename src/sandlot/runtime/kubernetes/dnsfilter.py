"""The DNS filter of all sandbox Pods: one UDP and TCP listener, answering each query with the
filter (``sandlot.net.dns.DnsFilter``) of the sandbox whose Pod sent it.

Every sandbox Pod names this listener as its only resolver (``dnsPolicy: None``), and the
sandbox is told by the query's source address, its Pod IP: Pod addresses are not translated
between Pods and the server on a Pod network (a Service in front of the server translates the
destination only). A query from an address that is no sandlot sandbox's is refused (REFUSED,
and one log line per address and minute), so the cluster's other Pods cannot use it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import cast

from dnslib import RCODE, DNSRecord

from sandlot.net.dns import DnsFilter

log = logging.getLogger(__name__)
# The filter of the sandbox at a Pod IP (None: none of ours).
FilterOf = Callable[[str], Awaitable[DnsFilter | None]]
REFUSED_LOG_EVERY = 60.0


def refused(data: bytes) -> bytes | None:
    try:
        request = DNSRecord.parse(data)
    except Exception:  # noqa: BLE001 - dnslib raises several types on garbage
        return None
    reply = request.reply()
    reply.header.rcode = RCODE.REFUSED
    return bytes(reply.pack())


class PodDnsServer(asyncio.DatagramProtocol):
    """The shared listener (see module docstring)."""

    def __init__(self, filter_of: FilterOf) -> None:
        self.filter_of = filter_of
        self.transport: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refused_logged: dict[str, float] = {}

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        try:
            self.tcp = await asyncio.start_server(self._serve_tcp, host, port)
        except BaseException:
            self.close()
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not isinstance(asyncio.DatagramTransport): uvloop's transports are not.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        task = asyncio.get_running_loop().create_task(self._answer_udp(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, source: str, data: bytes) -> bytes | None:
        flt = await self.filter_of(source)
        if flt is None:
            self._log_refused(source)
            return refused(data)
        return await flt.answer(data)

    async def _answer_udp(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            reply = await self._answer(addr[0], data)
        except Exception:  # noqa: BLE001 - one query must not stop the listener
            log.exception("dns filter: answering %s failed", addr[0])
            return
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                         ) -> None:
        """DNS over TCP (RFC 1035 4.2.2): the sandbox's own filter serves the connection."""
        peer = writer.get_extra_info("peername")
        flt = await self.filter_of(str(peer[0])) if peer else None
        if flt is None:
            self._log_refused(str(peer[0]) if peer else "?")
            writer.close()
            return
        await flt.serve_tcp(reader, writer)

    def _log_refused(self, source: str) -> None:
        now = time.monotonic()
        if now - self._refused_logged.get(source, -REFUSED_LOG_EVERY) < REFUSED_LOG_EVERY:
            return
        if len(self._refused_logged) > 1024:
            self._refused_logged.clear()
        self._refused_logged[source] = now
        log.info("dns filter: a query from %s, which is no sandbox Pod of this server: REFUSED",
                 source)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.tcp is not None:
            self.tcp.close()
        for task in list(self._tasks):
            task.cancel()
