"""Direct endpoints: a loopback listener per sandbox port that forwards raw TCP into it.

Clients get ``127.0.0.1:<listener port>``. An accepted connection to a port the runtime
takes whole (``Runtime.hand_off``: execd's port on runc sandboxes) is given to the sandbox
as a descriptor and the server is out of it; any other is joined to a fresh connection into
the sandbox, a socket from the runtime's ``connect``, and relayed. Ports are persisted so a
restarted server offers the same addresses again.
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
# The runtime's ``hand_off`` (runtime/base.py): give an accepted connection to the sandbox.
HandOff = Callable[[str, int, socket.socket], bool]
# How long a connection to a sandbox still starting waits for that start (a create answered
# Pending: queued for a start slot in a burst, or pulling its image).
START_WAIT = 300.0
LISTEN_BACKLOG = 1024
_ACCEPT_BATCH = 64  # connections accepted per wake-up before the loop runs anything else
ACCEPT_RETRY_DELAY = 1.0  # seconds a listener pauses after a failed accept (no descriptors)


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        _nodelay_socket(sock)


def _nodelay_socket(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
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


class _Listener:
    """A loopback listener whose connections are accepted as plain sockets (not asyncio
    transports), so that one can be handed to the sandbox whole instead of relayed."""

    def __init__(self, sock: socket.socket, on_accept: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.on_accept = on_accept
        self.port = int(sock.getsockname()[1])
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        sock.listen(LISTEN_BACKLOG)
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: pause, as asyncio's servers do
                log.warning("endpoint listener %s: accept failed: %s", self.port, exc)
                self._loop.remove_reader(self.sock.fileno())
                self._loop.call_later(ACCEPT_RETRY_DELAY, self._resume)
                return
            self.on_accept(conn)

    def _resume(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()


class EndpointForwarder:
    """The direct endpoints' listeners, and the relays of the connections they accept.

    A connection to a port the runtime hands over (``hand_off``: execd's port on runc
    sandboxes) is given to the sandbox whole and forgotten here; any other is relayed.
    """

    def __init__(self, bind_host: str, connect: Connector, connect_grace: float = 2.0, *,
                 idle_timeout: float = 300.0, max_connections: int = 1024,
                 start_of: StartOf | None = None, port_range: PortRange | None = None,
                 hand_off: HandOff | None = None):
        self._bind_host = bind_host
        self._port_range = port_range  # where new listeners bind (endpoint_ports.py)
        self._start_of = start_of
        self._hand_off = hand_off
        # A relayed connection with no byte either way for this long is closed (held-open
        # idle connections would exhaust the server's file handles); past
        # ``max_connections`` relayed at once per sandbox, new ones are closed at once.
        # A handed-over connection is the sandbox's: the server holds nothing of it.
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.connect_grace = connect_grace
        self._connect = connect
        self._servers: dict[tuple[str, int], _Listener] = {}
        self._ports: dict[tuple[str, int], int] = {}
        self._conns: dict[str, set[asyncio.Task[None]]] = {}
        self._lock = asyncio.Lock()
        self.bytes_in = Tally()  # from clients into sandboxes (relayed connections)
        self.bytes_out = Tally()  # from sandboxes back to clients (relayed connections)
        self.handed_off = Tally()  # connections given to the sandbox whole

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
            sock = None
            if preferred:
                try:
                    sock = bind_listener(self._bind_host, preferred)
                except OSError:
                    log.warning("port %s for %s:%s is taken; using another", preferred, *key)
            if sock is None:
                sock = bind_in_range(self._bind_host, self._port_range, set(self._ports.values()))
            try:
                listener = _Listener(sock, lambda conn: self._accepted(sandbox_id, port, conn))
            except BaseException:
                sock.close()
                raise
            self._servers[key] = listener
            self._ports[key] = listener.port
            return listener.port

    def _accepted(self, sandbox_id: str, port: int, conn: socket.socket) -> None:
        conns = self._conns.setdefault(sandbox_id, set())
        if len(conns) >= self.max_connections:
            log.warning("endpoint %s:%s: %d connections open; refusing another", sandbox_id,
                        port, len(conns))
            conn.close()
            return
        conn.setblocking(False)
        _nodelay_socket(conn)
        if not self._starting(sandbox_id) and self._try_hand_off(sandbox_id, port, conn):
            return
        task = asyncio.get_running_loop().create_task(self._serve(sandbox_id, port, conn))
        conns.add(task)
        task.add_done_callback(conns.discard)

    def _starting(self, sandbox_id: str) -> bool:
        return self._start_of is not None and self._start_of(sandbox_id) is not None

    def _try_hand_off(self, sandbox_id: str, port: int, conn: socket.socket) -> bool:
        """Whether ``conn`` went to the sandbox whole (then this side's copy is closed)."""
        if self._hand_off is None:
            return False
        try:
            taken = self._hand_off(sandbox_id, port, conn)
        except Exception as exc:  # noqa: BLE001 - not now (starting, paused, old execd): relay
            log.debug("endpoint %s:%s not handed over: %s", sandbox_id, port, exc)
            return False
        if taken:
            self.handed_off.n += 1
            conn.close()
        return taken

    async def _serve(self, sandbox_id: str, port: int, conn: socket.socket) -> None:
        """Relay ``conn`` (or hand it over once the sandbox can take it)."""
        loop = asyncio.get_running_loop()
        client_t: asyncio.Transport | None = None
        up_t: asyncio.Transport | None = None
        try:
            upstream = await self._connect_soon(sandbox_id, port, conn)
            if upstream is None:
                return
            done: asyncio.Future[None] = loop.create_future()
            up_relay = _Relay(done, self.bytes_out)
            try:
                await loop.create_connection(lambda: up_relay, sock=upstream)
            except BaseException:
                upstream.close()
                raise
            up_t = up_relay.own
            assert up_t is not None
            _nodelay(up_t)
            client = _Relay(done, self.bytes_in)
            await loop.connect_accepted_socket(lambda: client, conn)
            client_t = client.own
            assert client_t is not None
            client.start(up_t, up_relay)
            up_relay.start(client_t, client)
            await self._until_done_or_idle(client, up_relay)
        finally:
            if up_t is not None:
                up_t.close()
            if client_t is not None:
                client_t.close()
            else:
                conn.close()

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

    async def _connect_soon(self, sandbox_id: str, port: int,
                            conn: socket.socket) -> socket.socket | None:
        """Connect inside, retrying briefly: a client may dial while the sandbox still starts.
        None: nothing answered in time, or ``conn`` was handed over meanwhile.

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
            if self._try_hand_off(sandbox_id, port, conn):
                return None
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
            listeners = [self._servers.pop(k) for k in keys]
            for k in keys:
                self._ports.pop(k, None)
        for listener in listeners:
            listener.close()
        tasks = self._conns.pop(sandbox_id, set())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for sandbox_id in {k[0] for k in list(self._servers)} | set(self._conns):
            await self.close_sandbox(sandbox_id)
