"""Direct endpoints: a loopback listener per sandbox port that forwards raw TCP into it.

Clients get ``127.0.0.1:<listener port>``; each accepted connection is joined to a fresh
connection into the sandbox, a socket from the runtime's ``connect`` (execd's port included).
Ports are persisted so a restarted server offers the same addresses again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import cast

from sandlot.server.endpoint_ports import PortRange, bind_in_range, bind_listener

log = logging.getLogger(__name__)

Connector = Callable[[str, int], Awaitable[socket.socket]]
# The start of a sandbox still starting (None once it runs, failed or is unknown).
StartOf = Callable[[str], "asyncio.Future[None] | None"]
# How long a connection to a sandbox still starting waits for that start (a create answered
# Pending: queued for a start slot in a burst, or pulling its image).
START_WAIT = 300.0


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Tally:
    """A running byte count (read by ``/metrics``)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class _Relay(asyncio.Protocol):
    """One direction's receiver: what ``own`` receives is written straight to ``peer``.

    No stream buffers and no task switch per chunk (asyncio streams copied each chunk into
    a buffer and out again and woke a task for it): a chunk read by the loop is handed to
    the other socket in the same callback. Flow control: when ``own``'s write buffer fills
    (the peer sends faster than this side takes), reading from ``peer`` pauses.
    """

    def __init__(self, done: asyncio.Future[None], tally: Tally) -> None:
        self.tally = tally  # bytes received on ``own``
        self.own: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.partner: _Relay | None = None
        self.eof = False
        self.done = done
        self.early: list[bytes] = []  # received before the peer was connected
        self.early_eof = False
        self.last_active = asyncio.get_running_loop().time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not isinstance(asyncio.Transport): uvloop's transports (the server's loop) are not.
        self.own = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.last_active = asyncio.get_running_loop().time()
        self.tally.n += len(data)
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.peer is None:
            self.early_eof = True
            return True
        if self.peer.can_write_eof() and not self.peer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                self.peer.write_eof()
        if self.partner is not None and self.partner.eof:
            self._finish()
        return True  # half-closed: the other direction may still carry data

    def pause_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def start(self, peer: asyncio.Transport, partner: _Relay) -> None:
        """Connect to ``peer``; forward anything received before."""
        self.peer, self.partner = peer, partner
        for data in self.early:
            peer.write(data)
        self.early.clear()
        if self.early_eof:
            self.eof_received()


class _Accepted(_Relay):
    """The client side of a forwarded connection; its task connects the upstream."""

    def __init__(self, forwarder: EndpointForwarder, sandbox_id: str, port: int) -> None:
        super().__init__(asyncio.get_running_loop().create_future(), forwarder.bytes_in)
        self.forwarder = forwarder
        self.sandbox_id = sandbox_id
        self.port = port
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.own is not None
        self.own.pause_reading()  # until the upstream is connected
        _nodelay(self.own)
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        # Cancelled by close_sandbox(): a normal end, not an error to report.
        with contextlib.suppress(asyncio.CancelledError):
            await self.forwarder._serve(self.sandbox_id, self.port, self)


class EndpointForwarder:
    def __init__(self, bind_host: str, connect: Connector, connect_grace: float = 2.0, *,
                 idle_timeout: float = 300.0, max_connections: int = 1024,
                 start_of: StartOf | None = None, port_range: PortRange | None = None):
        self._bind_host = bind_host
        self._port_range = port_range  # where new listeners bind (endpoint_ports.py)
        self._start_of = start_of
        # A connection with no byte either way for this long is closed (held-open idle
        # connections would exhaust the server's file handles); past ``max_connections``
        # open at once per sandbox, new ones are closed at once.
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.connect_grace = connect_grace
        self._connect = connect
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._ports: dict[tuple[str, int], int] = {}
        self._conns: dict[str, set[asyncio.Task[None]]] = {}
        self._lock = asyncio.Lock()
        self.bytes_in = Tally()  # from clients into sandboxes
        self.bytes_out = Tally()  # from sandboxes back to clients

    def port_of(self, sandbox_id: str, port: int) -> int | None:
        return self._ports.get((sandbox_id, port))

    def listener_count(self, sandbox_id: str) -> int:
        return sum(1 for sid, _ in self._ports if sid == sandbox_id)

    async def open(self, sandbox_id: str, port: int, preferred: int | None = None) -> int:
        """Start (or reuse) the listener; try ``preferred`` first, else any free port."""
        key = (sandbox_id, port)
        async with self._lock:
            if key in self._ports:
                return self._ports[key]

            loop = asyncio.get_running_loop()

            def factory() -> asyncio.Protocol:
                return _Accepted(self, sandbox_id, port)

            sock = None
            if preferred:
                try:
                    sock = bind_listener(self._bind_host, preferred)
                except OSError:
                    log.warning("port %s for %s:%s is taken; using another", preferred, *key)
            if sock is None:
                sock = bind_in_range(self._bind_host, self._port_range, set(self._ports.values()))
            try:
                server = await loop.create_server(factory, sock=sock)
            except BaseException:
                sock.close()
                raise
            host_port = int(server.sockets[0].getsockname()[1])
            self._servers[key] = server
            self._ports[key] = host_port
            return host_port

    async def _serve(self, sandbox_id: str, port: int, client: _Accepted) -> None:
        task = asyncio.current_task()
        assert task is not None
        conns = self._conns.setdefault(sandbox_id, set())
        client_t = client.own
        assert client_t is not None
        if len(conns) >= self.max_connections:
            log.warning("endpoint %s:%s: %d connections open; refusing another", sandbox_id,
                        port, len(conns))
            client_t.close()
            return
        conns.add(task)  # type: ignore[arg-type]
        up_t: asyncio.Transport | None = None
        try:
            upstream = await self._connect_soon(sandbox_id, port)
            if upstream is None:
                return
            up_relay = _Relay(client.done, self.bytes_out)
            try:
                await asyncio.get_running_loop().create_connection(lambda: up_relay,
                                                                   sock=upstream)
            except BaseException:
                upstream.close()
                raise
            up_t = up_relay.own
            assert up_t is not None
            _nodelay(up_t)
            client.start(up_t, up_relay)
            up_relay.start(client_t, client)
            client_t.resume_reading()
            await self._until_done_or_idle(client, up_relay)
        finally:
            conns.discard(task)  # type: ignore[arg-type]
            if up_t is not None:
                up_t.close()
            client_t.close()

    async def _until_done_or_idle(self, client: _Relay, upstream: _Relay) -> None:
        loop = asyncio.get_running_loop()
        while True:
            idle_for = loop.time() - max(client.last_active, upstream.last_active)
            left = self.idle_timeout - idle_for
            if left <= 0:
                return
            done, _ = await asyncio.wait({client.done}, timeout=left)
            if done:
                return

    async def _connect_soon(self, sandbox_id: str, port: int) -> socket.socket | None:
        """Connect inside, retrying briefly: a client may dial while the sandbox still starts.

        Closing at once would make clients back off for much longer than execd needs to come
        up (the released SDK waits 0.5 s and more after an early EOF). A sandbox whose start
        is still under way (answered Pending: queued in a burst, or pulling) is waited for
        first: dialing it every few ms would cost the server CPU the starts need, and giving
        up after the grace would send the client into its back-off (seen in a 50-create
        burst: 44 of 50 readiness probes retried, each 0.5 s or more on the figure).
        """
        start = self._start_of(sandbox_id) if self._start_of is not None else None
        if start is not None:
            # Only waits: the start's outcome is the create's to report (a failed one ends
            # below, like any sandbox that does not answer).
            await asyncio.wait({start}, timeout=START_WAIT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_grace
        delay = 0.005
        while True:
            try:
                return await self._connect(sandbox_id, port)
            except Exception as exc:  # the service is not (yet) listening inside
                if loop.time() + delay > deadline:
                    log.debug("endpoint %s:%s not reachable: %s", sandbox_id, port, exc)
                    return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def close_sandbox(self, sandbox_id: str) -> None:
        async with self._lock:
            keys = [k for k in self._servers if k[0] == sandbox_id]
            servers = [self._servers.pop(k) for k in keys]
            for k in keys:
                self._ports.pop(k, None)
        for server in servers:
            server.close()
        tasks = self._conns.pop(sandbox_id, set())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def close(self) -> None:
        for sandbox_id in {k[0] for k in list(self._servers)} | set(self._conns):
            await self.close_sandbox(sandbox_id)
