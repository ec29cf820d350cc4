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
import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import cast

from dnslib import RCODE, DNSRecord

from sandlot.net.dns import DnsFilter

log = logging.getLogger(__name__)
# The filter of the sandbox at a Pod IP (None: none of ours).
FilterOf = Callable[[str], Awaitable[DnsFilter | None]]
REFUSED_LOG_EVERY = 60.0
# Linux's IP_FREEBIND and IPV6_FREEBIND (<linux/in.h>, <linux/in6.h>): Python 3.11's socket
# module names neither.
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
IPV6_FREEBIND = 78


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
        self._family: int = socket.AF_INET  # the listen address, set by start
        self._address = ""

    async def start(self, host: str, port: int) -> bool:
        """Listen on ``host:port`` (UDP and TCP); whether ``host`` is on one of this host's
        interfaces now.

        The sockets are bound with ``IP_FREEBIND``, so an address that is not there yet is
        no failure: a node's Pod bridge (where Pods reach a server outside the cluster) gets
        its address with the node's first Pod, and queries arrive once it has it."""
        family, address = _listen_address(host, port)
        self._family, self._address = family, address[0]
        present = self.address_present()
        loop = asyncio.get_running_loop()
        udp = _bound_socket(family, socket.SOCK_DGRAM, address)
        try:
            await loop.create_datagram_endpoint(lambda: self, sock=udp)
        except BaseException:
            udp.close()
            raise
        try:
            tcp = _bound_socket(family, socket.SOCK_STREAM, address)
            try:
                self.tcp = await asyncio.start_server(self._serve_tcp, sock=tcp)
            except BaseException:
                tcp.close()
                raise
        except BaseException:
            self.close()
            raise
        return present

    def address_present(self) -> bool:
        """Whether the (started) listener's address is on one of this host's interfaces."""
        return address_is_local(self._family, self._address)

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


def _listen_address(host: str, port: int) -> tuple[int, tuple[str, int]]:
    """(family, socket address) of a listen host (an address, a name, or empty: all)."""
    info = socket.getaddrinfo(host or None, port, type=socket.SOCK_DGRAM,
                              flags=socket.AI_PASSIVE)[0]
    return info[0], (str(info[4][0]), int(info[4][1]))


def listen_host_is_local(host: str) -> bool:
    """Whether a listen host (an address, a name, or empty: all) is on one of this host's
    interfaces now."""
    family, address = _listen_address(host, 0)
    return address_is_local(family, address[0])


def address_is_local(family: int, address: str) -> bool:
    """Whether ``address`` can be bound without ``IP_FREEBIND`` (it is on an interface)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def _bound_socket(family: int, kind: int, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, kind)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
