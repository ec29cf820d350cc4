"""execd's own HTTP/1.1 server for its ASGI app: h11 for HTTP, websockets' sans-I/O protocol
for the PTY attach's WebSocket.

Why not uvicorn: an idle sandbox must cost (almost) no CPU. uvicorn's ``Server.serve`` wakes
ten times a second for its housekeeping tick even with no connection at all, which made 100
idle sandboxes cost a quarter of a core; and hibernation (closing and re-opening execd's
listeners, resetting its connections) could only be done through uvicorn's attributes. This
layer owns both: it does nothing between requests (timers exist only while a connection is
open), and ``close_listeners`` / ``reset_connections`` / ``listen`` are its own methods. The
parsing and framing stay in well-kept libraries (h11, websockets); this module is the glue
between their events and ASGI's messages.

Slow clients are bounded as in ``sandlot.http_deadlines``: the request head within
``header_timeout`` seconds, a body that pauses longer than ``body_idle_timeout`` cuts the
connection, an idle kept-alive connection is closed after ``keep_alive_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import h11

LOG = logging.getLogger("sandlot.execd.http")
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Scope]], Callable[[Scope], Awaitable[None]]],
                   Awaitable[None]]
READ_HIGH_WATER = 256 * 1024  # request body bytes buffered before reading pauses
CORK_LIMIT = 64 * 1024  # response bytes held back to the end of a loop step (see _cork)
WS_MAX_SIZE = 16 * 1024 * 1024  # as uvicorn's default
# Response pieces larger than this together are written one by one, not joined (a copy).
SEPARATE_WRITES = 64 * 1024
WS_CLOSE_WAIT = 5.0  # seconds for the peer's close frame after ours
_DISCONNECT = {"type": "http.disconnect"}


class _DateHeader:
    """The ``Date`` header value, formatted at most once a second (on demand, no timer)."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def value(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


_DATE = _DateHeader()


class HttpServer:
    """Serves ``app`` on listening sockets until ``request_exit``; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        header_timeout: float = 30.0,
        body_idle_timeout: float = 60.0,
        keep_alive_timeout: float = 75.0,
        shutdown_grace: float = 1.0,
        ws_ping_interval: float | None = 30.0,
        ws_max_size: int = WS_MAX_SIZE,
    ) -> None:
        self.app = app
        self.ws_max_size = ws_max_size
        self.header_timeout = header_timeout
        self.body_idle_timeout = body_idle_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.shutdown_grace = shutdown_grace
        self.ws_ping_interval = ws_ping_interval
        self.connections: set[_Connection] = set()
        self.listeners: list[asyncio.Server] = []
        self.started = asyncio.Event()
        self._exit = asyncio.Event()
        self._lifespan = _Lifespan(app)

    # -- life cycle ---------------------------------------------------------------------
    async def serve(self, sockets: Iterable[socket.socket]) -> None:
        """Start the app (ASGI lifespan), listen, and serve until ``request_exit``."""
        await self._lifespan.startup()
        try:
            await self.listen(sockets)
            self.started.set()
            await self._exit.wait()
        finally:
            await self._shut_down()

    def request_exit(self) -> None:
        self._exit.set()

    @property
    def app_state(self) -> dict[str, Any]:
        """What the app's lifespan startup stored; each request's scope gets a shallow copy."""
        return self._lifespan.state

    async def _shut_down(self) -> None:
        self.close_listeners()
        for conn in list(self.connections):
            conn.close_when_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        await self._lifespan.shutdown()

    # -- listeners (hibernation closes and re-opens them) -------------------------------
    async def listen(self, sockets: Iterable[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            self.listeners.append(await loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=1024))

    def adopt(self, sock: socket.socket) -> None:
        """Serve a connection accepted elsewhere (the host's endpoint listener hands them
        over: execd/handoff.py) like one accepted here."""
        asyncio.get_running_loop().create_task(self._adopt(sock))

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Connection(self), sock)
        except Exception:  # noqa: BLE001 - the client's connection ends; execd serves on
            LOG.exception("handed-over connection not served")
            sock.close()

    def close_listeners(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()

    def reset_connections(self) -> None:
        """Cut every connection with a TCP reset (no TIME_WAIT socket is left behind)."""
        for conn in list(self.connections):
            conn.abort(reset=True)


class _Lifespan:
    """The ASGI lifespan protocol: the app's start-up before listening, its shut-down last."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[Scope] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.state: dict[str, Any] = {}

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._outbox.put)
        except BaseException as exc:  # an app without lifespan support raises here
            await self._outbox.put({"type": "lifespan.failed", "message": repr(exc)})
            raise

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        answer = await self._outbox.get()
        if answer["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"execd: app start-up failed: {answer.get('message', '')}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox.get(), 10.0)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._task, 1.0)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one after the other, or one WebSocket."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.h11 = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self.cycle: _Cycle | None = None
        self.ws: _WebSocket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._closing_when_idle = False
        self.peer: Any = None
        self.local: Any = None
        self.ws_request: h11.Request | None = None
        self._pipelined = 0  # bytes that came while a response was still being sent
        self._draining = 0  # bytes of a body the app did not read (see cycle_done)
        self._corked: list[bytes] = []  # written in this step of the loop (see _cork)
        self._corked_size = 0
        self._flush_soon: asyncio.Handle | None = None

    # -- timers -------------------------------------------------------------------------
    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._timer_kind = kind
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = ""

    def _expire(self) -> None:
        kind, self._timer = self._timer_kind, None
        if kind == "body" and self._reading_paused:
            # Reading stopped because the app is not taking the body yet: the slow side is
            # this server, not the client.
            self._arm("body", self.server.body_idle_timeout)
            return
        self.abort()

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        self.peer = transport.get_extra_info("peername")
        self.local = transport.get_extra_info("sockname")
        self._arm("header", self.server.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self._drop_corked()
        self._disarm()
        if self.cycle is not None:
            self.cycle.disconnected()
        if self.ws is not None:
            self.ws.disconnected()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def drain(self) -> None:
        if self._writable is not None and not self._writable.done():
            await self._writable

    def data_received(self, data: bytes) -> None:
        if self.ws is not None:
            self.ws.data_received(data)
            return
        if self._timer_kind == "keep-alive":  # the next request's first bytes
            self._arm("header", self.server.header_timeout)
        elif self._timer_kind == "body":
            self._arm("body", self.server.body_idle_timeout)
        self.h11.receive_data(data)
        if self.cycle is not None and self.h11.their_state is h11.DONE:
            # A pipelined request: h11 keeps it until this response is sent; bound that.
            self._pipelined += len(data)
            if self._pipelined > READ_HIGH_WATER:
                self._pause_reading()
            return
        self._handle_events()

    def eof_received(self) -> bool | None:
        if self.ws is None and self.cycle is None:
            self.h11.receive_data(b"")
            self._handle_events()
        return None  # asyncio closes the transport: a running request sees its disconnect

    # -- h11 events -----------------------------------------------------------------------
    def _handle_events(self) -> None:
        while self.transport is not None and not self.transport.is_closing():
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._bad_request(exc)
                return
            if event is h11.NEED_DATA:
                if self.cycle is not None and self.h11.their_state is h11.SEND_BODY:
                    self._pause_reading_if_full()
                return
            if event is h11.PAUSED:
                if self.h11.their_state is h11.MIGHT_SWITCH_PROTOCOL and self.ws is None:
                    self._start_websocket()
                return  # else the next request waits in h11's buffer for this response
            if isinstance(event, h11.Request):
                self._start_request(event)
            elif isinstance(event, h11.Data):
                if self.cycle is not None:
                    self.cycle.body_received(bytes(event.data))
                else:
                    self._draining += len(event.data)
                    if self._draining >= READ_HIGH_WATER:
                        self.close()
                        return
            elif isinstance(event, h11.EndOfMessage):
                self._disarm()
                if self.cycle is not None:
                    self.cycle.body_complete()
                elif self.h11.our_state is h11.DONE:  # the rest of an unread body
                    self.cycle_done()
                    return
            elif isinstance(event, h11.ConnectionClosed):
                if self.cycle is not None:
                    self.cycle.disconnected()
                self.close_when_idle()
                return

    def _bad_request(self, exc: h11.RemoteProtocolError) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE) and self.cycle is None \
                and self.ws is None:
            body = f"Invalid HTTP request: {exc}".encode()
            with contextlib.suppress(h11.LocalProtocolError):
                self.write(self.h11.send(h11.Response(
                    status_code=exc.error_status_hint,
                    headers=[(b"content-type", b"text/plain; charset=utf-8"),
                             (b"content-length", str(len(body)).encode()),
                             (b"connection", b"close")])))
                self.write(self.h11.send(h11.Data(data=body)))
                self.write(self.h11.send(h11.EndOfMessage()))
        self.close()

    def _start_request(self, request: h11.Request) -> None:
        if self.h11.their_state is h11.SEND_BODY:
            self._arm("body", self.server.body_idle_timeout)
        else:
            self._disarm()
        upgrade = {v.lower() for k, v in request.headers if k == b"upgrade"}
        if b"websocket" in upgrade and request.method == b"GET":
            self.ws_request = request
            return  # h11 pauses after the head: _start_websocket
        self.cycle = _Cycle(self, request)
        asyncio.get_running_loop().create_task(self.cycle.run())

    def cycle_done(self) -> None:
        """The response is sent: go on with the next request, or close."""
        self.cycle = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.h11.our_state is h11.MUST_CLOSE or self._closing_when_idle:
            self.close()
            return
        if self.h11.their_state is h11.SEND_BODY and self._draining < READ_HIGH_WATER:
            # The app answered before reading the whole body: read the rest (a little) and
            # go on with the next request then; a bigger rest closes the connection.
            self._resume_reading()
            self._arm("body", self.server.body_idle_timeout)
            return
        if self.h11.their_state is not h11.DONE:
            self.close()
            return
        try:
            self.h11.start_next_cycle()
        except h11.LocalProtocolError:
            self.close()
            return
        self._arm("keep-alive", self.server.keep_alive_timeout)
        self._pipelined = self._draining = 0
        self._resume_reading()
        self._handle_events()  # a pipelined request may be buffered already

    def close_when_idle(self) -> None:
        self._closing_when_idle = True
        if self.cycle is None and self.ws is None:
            self.close()

    def abort(self, reset: bool = False) -> None:
        if self.transport is None:
            return
        self._drop_corked()
        if reset:
            sock = self.transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    # -- flow control -------------------------------------------------------------------
    def write(self, data: bytes | None) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self._cork(data)

    def writelines(self, data: list[Any] | None) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            for part in data:
                self._cork(part)

    def _cork(self, data: bytes) -> None:
        """Keep ``data`` until the end of this step of the loop (or CORK_LIMIT bytes), so
        that what the app sends in one go leaves in one segment: a response's head with its
        first body chunk, a stream's last events with the chunked end. Each separate write
        is a send and a wake-up of the reader (and of every relay on the way)."""
        self._corked.append(data)
        self._corked_size += len(data)
        if self._corked_size >= CORK_LIMIT:
            self.flush()
        elif self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what is corked to the transport now."""
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        corked, size = self._corked, self._corked_size
        self._corked, self._corked_size = [], 0
        if not corked or self.transport is None or self.transport.is_closing():
            return
        if len(corked) == 1 or size >= SEPARATE_WRITES:
            # A large block goes as it is: joining it to its chunk framing would copy it
            # whole before the socket's own copy.
            for piece in corked:
                if piece:
                    self.transport.write(piece)
        else:
            self.transport.write(b"".join(corked))

    def _drop_corked(self) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        self._corked, self._corked_size = [], 0

    def close(self) -> None:
        """Send what is corked, then close (the transport sends its own buffer first)."""
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _pause_reading_if_full(self) -> None:
        if self.cycle is not None and self.cycle.buffered >= READ_HIGH_WATER:
            self._pause_reading()

    def body_taken(self) -> None:
        """The app took the buffered body: read more."""
        if self._reading_paused and self.cycle is not None and \
                self.h11.their_state is h11.SEND_BODY:
            self._resume_reading()

    # -- WebSocket ----------------------------------------------------------------------
    def _start_websocket(self) -> None:
        request = self.ws_request
        assert request is not None
        trailing, _closed = self.h11.trailing_data
        try:
            self.ws = _WebSocket(self, request)
        except ValueError as exc:
            self._bad_request(h11.RemoteProtocolError(str(exc), 400))
            return
        asyncio.get_running_loop().create_task(self.ws.run())
        if trailing:
            self.ws.data_received(bytes(trailing))

    def scope_base(self, request: h11.Request, kind: str) -> dict[str, Any]:
        target = bytes(request.target)
        raw_path, _, query = target.partition(b"?")
        server = self.local if isinstance(self.local, tuple) else None
        client = self.peer if isinstance(self.peer, tuple) else None
        return {
            "type": kind,
            # 2.3: a send after the client has gone is dropped (2.4 would raise OSError);
            # Starlette then watches for ``http.disconnect``, which receive() gives.
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode(),
            "scheme": "ws" if kind == "websocket" else "http",
            "method": request.method.decode(),
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in request.headers],
            "server": server[:2] if server else None,
            "client": client[:2] if client else None,
            "state": dict(self.server.app_state),
        }


class _Cycle:
    """One HTTP request and its response, between h11 and the ASGI app."""

    def __init__(self, conn: _Connection, request: h11.Request) -> None:
        self.conn = conn
        self.request = request
        self.head = request.method == b"HEAD"
        self.body: list[bytes] = []
        self.buffered = 0
        self.body_done = conn.h11.their_state is not h11.SEND_BODY
        self.is_disconnected = False
        self.response_started = False
        self.response_done = False
        self._sent_end = False
        self._wake: asyncio.Future[None] | None = None

    # events from the connection
    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def body_received(self, data: bytes) -> None:
        self.body.append(data)
        self.buffered += len(data)
        self._notify()

    def body_complete(self) -> None:
        self.body_done = True
        self._notify()

    def disconnected(self) -> None:
        self.is_disconnected = True
        self._notify()

    # ASGI
    async def receive(self) -> dict[str, Any]:
        while True:
            if self.is_disconnected or self.response_done:
                return _DISCONNECT
            if self.body or (self.body_done and not self._sent_end):
                data = b"".join(self.body)
                self.body.clear()
                self.buffered = 0
                more = not self.body_done
                self._sent_end = not more
                self.conn.body_taken()
                return {"type": "http.request", "body": data, "more_body": more}
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    async def send(self, message: Scope) -> None:
        kind = message["type"]
        conn = self.conn
        if self.is_disconnected:
            return  # as uvicorn: writes after a disconnect are dropped
        if kind == "http.response.start":
            if self.response_started:
                raise RuntimeError("execd: response already started")
            self.response_started = True
            headers = [(b"date", _DATE.value()), *message.get("headers", [])]
            conn.write(conn.h11.send(h11.Response(
                status_code=message["status"], headers=headers)))
        elif kind == "http.response.body":
            if not self.response_started or self.response_done:
                raise RuntimeError(f"execd: unexpected {kind}")
            body = message.get("body", b"")
            if body and not self.head:
                # passthrough: the body is written as it is, not copied into h11's framing
                conn.writelines(conn.h11.send_with_data_passthrough(h11.Data(data=body)))
            if not message.get("more_body", False):
                self.response_done = True
                conn.write(conn.h11.send(h11.EndOfMessage()))
                self._notify()
            await conn.drain()
        else:
            raise RuntimeError(f"execd: unexpected ASGI message {kind!r}")

    async def run(self) -> None:
        scope = self.conn.scope_base(self.request, "http")
        scope["extensions"] = {}
        try:
            await self.conn.server.app(scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.conn.abort()
                raise
            LOG.exception("execd: exception in ASGI application")
            if not self.response_started and not self.is_disconnected:
                self._plain_error(500, b"Internal Server Error")
            else:
                self.conn.abort()
                return
        if not self.response_done:
            if not self.response_started and not self.is_disconnected:
                self._plain_error(500, b"Internal Server Error")
            else:
                self.conn.abort()
                return
        self.conn.cycle_done()

    def _plain_error(self, status: int, text: bytes) -> None:
        conn = self.conn
        self.response_started = self.response_done = True
        conn.write(conn.h11.send(h11.Response(status_code=status, headers=[
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(text)).encode()), (b"connection", b"close")])))
        conn.write(conn.h11.send(h11.Data(data=text)))
        conn.write(conn.h11.send(h11.EndOfMessage()))


class _WebSocket:
    """A WebSocket connection: ASGI ``websocket`` messages over websockets' sans-I/O
    ``ServerProtocol`` (handshake checks, framing, ping/pong and close replies)."""

    def __init__(self, conn: _Connection, request: h11.Request) -> None:
        from websockets.http11 import Request
        from websockets.server import ServerProtocol

        self.conn = conn
        self.request = request
        self.proto = ServerProtocol(max_size=conn.server.ws_max_size)
        # The protocol parses the handshake request itself (its parser then goes on with the
        # frames): hand it the head h11 has parsed, as bytes.
        head = b"".join([b"GET ", bytes(request.target), b" HTTP/1.1\r\n",
                         *(bytes(k) + b": " + bytes(v) + b"\r\n" for k, v in request.headers),
                         b"\r\n"])
        self.proto.receive_data(head)
        parsed = [e for e in self.proto.events_received() if isinstance(e, Request)]
        if not parsed:
            raise ValueError("execd: the WebSocket handshake request did not parse")
        self.ws_request = parsed[0]
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        self.accepted = False
        self.closed = False
        self.denial_started = False
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._ping: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []  # frames sent before our handshake answer
        self._denial_status = 500
        self._denial_headers: list[Any] = []
        self._denial_body: list[bytes] = []

    def _flush(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                self.conn.write(data)
            else:  # b"": the protocol wants the TCP closed
                self.conn.close()

    def data_received(self, data: bytes) -> None:
        if not self.accepted:
            self._early.append(data)
            return
        from websockets.frames import Frame, Opcode

        self.proto.receive_data(data)
        for frame in self.proto.events_received():
            if not isinstance(frame, Frame):
                continue
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                self._fragment_text = frame.opcode is Opcode.TEXT
                self._fragments = [bytes(frame.data)]
            elif frame.opcode is Opcode.CONT:
                self._fragments.append(bytes(frame.data))
            elif frame.opcode is Opcode.CLOSE:
                code = self.proto.close_code or 1005
                self._closed(code, self.proto.close_reason or "")
                continue
            else:
                continue
            if frame.fin:
                payload = b"".join(self._fragments)
                self._fragments = []
                if self._fragment_text:
                    self.inbox.put_nowait({"type": "websocket.receive",
                                           "text": payload.decode("utf-8")})
                else:
                    self.inbox.put_nowait({"type": "websocket.receive", "bytes": payload})
        self._flush()

    def _closed(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            if self._ping is not None:
                self._ping.cancel()
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": code,
                                   "reason": reason})

    def disconnected(self) -> None:
        self._closed(1006, "")

    def _schedule_ping(self) -> None:
        interval = self.conn.server.ws_ping_interval
        if interval:
            self._ping = asyncio.get_running_loop().call_later(interval, self._send_ping)

    def _send_ping(self) -> None:
        if not self.closed:
            self.proto.send_ping(b"")
            self._flush()
            self._schedule_ping()

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: Scope) -> None:
        kind = message["type"]
        conn = self.conn
        if kind == "websocket.accept":
            response = self.proto.accept(self.ws_request)
            if response.status_code != 101:
                self.denial_started = True
                self.proto.send_response(response)
                self._flush()
                conn.close()
                self._closed(1006, "")
                return
            subprotocol = message.get("subprotocol")
            if subprotocol:
                response.headers["Sec-WebSocket-Protocol"] = subprotocol
            for name, value in message.get("headers", []):
                response.headers[bytes(name).decode("latin-1")] = bytes(value).decode("latin-1")
            self.proto.send_response(response)
            self.accepted = True
            self._flush()
            self._schedule_ping()
            early, self._early = b"".join(self._early), []
            if early:
                self.data_received(early)
        elif kind == "websocket.send":
            if self.closed:
                raise RuntimeError("execd: send on a closed WebSocket")
            if message.get("bytes") is not None:
                self.proto.send_binary(message["bytes"])
            else:
                self.proto.send_text(str(message.get("text", "")).encode())
            self._flush()
            await conn.drain()
        elif kind == "websocket.close":
            if not self.accepted:  # a refused handshake
                self._deny(403, [(b"content-type", b"text/plain")], b"")
                return
            if not self.closed:
                self.proto.send_close(message.get("code", 1000), message.get("reason") or "")
                self._flush()
                self._closed(message.get("code", 1000), message.get("reason") or "")
                loop = asyncio.get_running_loop()
                loop.call_later(WS_CLOSE_WAIT, conn.abort)
        elif kind == "websocket.http.response.start":
            self.denial_started = True
            self._denial_status = message["status"]
            self._denial_headers = list(message.get("headers", []))
            self._denial_body = []
        elif kind == "websocket.http.response.body":
            self._denial_body.append(message.get("body", b""))
            if not message.get("more_body", False):
                self._deny(self._denial_status, self._denial_headers,
                           b"".join(self._denial_body))
        else:
            raise RuntimeError(f"execd: unexpected ASGI message {kind!r}")

    def _deny(self, status: int, headers: list[Any], body: bytes) -> None:
        """An HTTP answer in place of the handshake (h11 still frames it)."""
        conn = self.conn
        self.denial_started = True
        headers = [(k, v) for k, v in headers if bytes(k).lower() != b"content-length"]
        headers += [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        with contextlib.suppress(h11.LocalProtocolError):
            conn.write(conn.h11.send(h11.Response(status_code=status, headers=headers)))
            conn.write(conn.h11.send(h11.Data(data=body)))
            conn.write(conn.h11.send(h11.EndOfMessage()))
        conn.close()
        self._closed(1006, "")

    async def run(self) -> None:
        scope = self.conn.scope_base(self.request, "websocket")
        scope["subprotocols"] = [p.strip() for k, v in self.request.headers
                                 if k == b"sec-websocket-protocol"
                                 for p in v.decode("latin-1").split(",") if p.strip()]
        scope["extensions"] = {"websocket.http.response": {}}
        try:
            await self.conn.server.app(scope, self.receive, self.send)
        except Exception:
            LOG.exception("execd: exception in ASGI WebSocket application")
            if not self.accepted and not self.denial_started:
                self._deny(500, [], b"")
                return
        if not self.accepted:
            if not self.denial_started:
                self._deny(403, [], b"")  # the app returned without accepting
            return
        if not self.closed:
            self.proto.send_close(1000, "")
            self._flush()
            self._closed(1000, "")
        asyncio.get_running_loop().call_later(WS_CLOSE_WAIT, self.conn.abort)
