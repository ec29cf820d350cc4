"""Interactive terminals (``/pty``), the reference execd's extension routes:

- ``POST /pty`` ``{cwd?, command?, cols?, rows?, envs?}`` -> 201 ``{session_id}``: starts a
  login-less shell (or ``command`` through the shell) on a new pseudo-terminal.
- ``GET /pty/{id}`` -> ``{session_id, running, output_offset, exit_code}``.
- ``DELETE /pty/{id}``: kills the terminal's process group and forgets it.
- ``GET /pty/{id}/ws[?since=N][&takeover=1]`` (WebSocket), the reference's frame protocol
  (``pkg/web/controller/pty_ws.go``, ``pkg/web/model/pty_ws.go``). Server: a binary replay
  frame ``0x03`` + 8-byte big-endian offset of its first byte + the buffered output from byte
  ``since`` (default 0), then JSON ``connected`` ``{session_id, mode: "pty"}``; output as
  binary ``0x01`` + bytes; JSON ``exit`` ``{exit_code}`` then a normal close ("process
  exited"); JSON ``pong`` and ``error`` ``{error, code}``. Client: binary ``0x00`` + stdin
  bytes, or JSON ``stdin`` ``{data}``, ``resize`` ``{cols, rows}``, ``signal`` ``{signal}``,
  ``ping``. One client at a time: another gets 409 ``ALREADY_CONNECTED`` unless it asks
  ``takeover=1``, which closes the holder with 4001 ``TAKEN_OVER``.

A dropped WebSocket leaves the terminal running; reconnecting with ``since`` = the byte count
seen replays what was missed (up to the last ``RING_BYTES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import termios
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from sandlot.errors import RuntimeFailure
from sandlot.execd import paths, procs
from sandlot.execd.commands import find_shell
from sandlot.execd.http import JSON, bad_request, expect_object, json_body, not_found, ok
from sandlot.execd.settings import Settings

RING_BYTES = 4 << 20
QUEUE_FRAMES = 4096
BIN_STDIN, BIN_STDOUT, BIN_REPLAY = 0x00, 0x01, 0x03
CLOSE_TAKEN_OVER = 4001
TAKEOVER_WAIT = 5.0

Frame = dict[str, Any] | bytes


def set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtySession:
    def __init__(
        self, sid: str, argv: list[str], cwd: str, env: dict[str, str], rows: int, cols: int
    ) -> None:
        self.id = sid
        self.loop = asyncio.get_running_loop()
        master, slave = os.openpty()
        set_winsize(master, rows, cols)
        os.set_inheritable(master, False)

        def child_setup() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            self.pid, self.exited = procs.spawn(
                argv,
                cwd=cwd,
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                preexec_fn=child_setup,
            )
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.master = master
        self.offset = 0  # bytes of output so far
        self.ring = bytearray()
        self.ring_start = 0  # offset of ring[0]
        self.exit_code: int | None = None
        self.eof = False
        self.clients: set[asyncio.Queue[Frame | None]] = set()
        self.holder: WebSocket | None = None  # the one attached client
        self.released = asyncio.Event()
        self.loop.add_reader(master, self._readable)
        self.exited.add_done_callback(self._on_exit)

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def _readable(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave fd closed
            data = b""
        if not data:
            self.loop.remove_reader(self.master)
            self.eof = True
            self._maybe_exit_frame()
            return
        self.offset += len(data)
        self.ring += data
        if len(self.ring) > RING_BYTES:
            drop = len(self.ring) - RING_BYTES
            del self.ring[:drop]
            self.ring_start += drop
        self._broadcast(bytes((BIN_STDOUT,)) + data)

    def _on_exit(self, fut: asyncio.Future[int]) -> None:
        self.exit_code = fut.result()
        # Let the reader drain what the process wrote last before announcing the exit.
        self.loop.call_later(0.05, self._force_exit_frame)

    def _force_exit_frame(self) -> None:
        if not self.eof:
            self._readable()
        self.eof = True
        self._maybe_exit_frame()

    def _maybe_exit_frame(self) -> None:
        if self.exit_code is not None and self.eof and not getattr(self, "_exit_sent", False):
            self._exit_sent = True
            self._broadcast({"type": "exit", "exit_code": self.exit_code})

    def _broadcast(self, frame: Frame) -> None:
        for q in list(self.clients):
            try:
                q.put_nowait(frame)
            except asyncio.QueueFull:
                self.clients.discard(q)
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(None)  # tell that client's writer it fell behind

    def replay(self, since: int) -> tuple[bytes, int]:
        """Buffered output from byte ``since`` on, and the offset of its first byte."""
        start = min(max(since, self.ring_start), self.offset)
        return bytes(self.ring[start - self.ring_start :]), start

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.master, view)
            except BlockingIOError:
                continue  # the terminal's input queue is full; the shell will read it
            view = view[n:]

    def resize(self, rows: int, cols: int) -> None:
        set_winsize(self.master, rows, cols)
        procs.kill_group(self.pid, signal.SIGWINCH)

    def signal(self, name: str) -> None:
        name = name.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals):
            raise ValueError(f"unknown signal {name}")
        # Deliver to the terminal's foreground job, like a keyboard signal would.
        try:
            pgid = os.tcgetpgrp(self.master)
        except OSError:
            pgid = self.pid
        procs.kill_group(pgid, sig)

    def close(self) -> None:
        procs.kill_group(self.pid, signal.SIGHUP)
        procs.kill_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.master)
        with contextlib.suppress(OSError):
            os.close(self.master)
        for q in list(self.clients):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait({"type": "error", "error": "terminal deleted", "code": "SESSION_GONE"})
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)
        self.clients.clear()

    def status(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "running": self.running,
            "output_offset": self.offset,
            "exit_code": self.exit_code,
        }


class PtyService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sessions: dict[str, PtySession] = {}

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        for s in list(self.sessions.values()):
            s.close()
        self.sessions.clear()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/pty", self.create_route, methods=["POST"]),
            Route("/pty/{sid}", self.status_route, methods=["GET"]),
            Route("/pty/{sid}", self.delete_route, methods=["DELETE"]),
            WebSocketRoute("/pty/{sid}/ws", self.ws_route),
        ]

    def get(self, sid: str) -> PtySession:
        session = self.sessions.get(sid)
        if session is None:
            raise not_found(f"pty session {sid} not found", code="CONTEXT_NOT_FOUND")
        return session

    async def create_route(self, request: Request) -> Response:
        body = await json_body(request, required=False)
        data = expect_object(body) if body is not None else {}
        cwd = data.get("cwd") or self.settings.workdir
        if not isinstance(cwd, str):
            raise bad_request("'cwd' must be a string")
        cwd = paths.expand(cwd)
        try:  # as the reference: ~/$VAR expanded, a missing directory created
            os.makedirs(cwd, exist_ok=True)
        except OSError as exc:
            raise RuntimeFailure(f"error creating pty session: {exc}") from None
        rows, cols = data.get("rows") or 24, data.get("cols") or 80
        if not all(isinstance(v, int) and 0 < v < 10000 for v in (rows, cols)):
            raise bad_request("'rows' and 'cols' must be positive integers")
        envs = data.get("envs") or {}
        if not isinstance(envs, dict):
            raise bad_request("'envs' must be an object")
        shell = find_shell()
        command = data.get("command")
        if command is not None and (not isinstance(command, str) or not command.strip()):
            raise bad_request("'command' must be a non-empty string")
        argv = (
            [shell, "-c", command]
            if command
            else [shell, "-i"]
            if shell.endswith("bash")
            else [shell]
        )
        env = dict(os.environ)
        env.setdefault("TERM", "xterm-256color")
        env.update({str(k): str(v) for k, v in envs.items()})
        sid = uuid.uuid4().hex
        try:
            self.sessions[sid] = PtySession(sid, argv, cwd, env, rows, cols)
        except OSError as exc:
            raise bad_request(f"cannot start terminal: {exc}") from None
        return JSON({"session_id": sid}, status_code=201)

    async def status_route(self, request: Request) -> Response:
        return JSON(self.get(request.path_params["sid"]).status())

    async def delete_route(self, request: Request) -> Response:
        session = self.get(request.path_params["sid"])
        self.sessions.pop(session.id, None)
        session.close()
        return ok()

    async def ws_route(self, ws: WebSocket) -> None:
        session = self.sessions.get(ws.path_params["sid"])
        if session is None:
            if "websocket.http.response" in ws.scope.get("extensions", {}):
                body = {"code": "CONTEXT_NOT_FOUND",
                        "message": f"pty session {ws.path_params['sid']} not found"}
                await ws.send_denial_response(JSON(body, status_code=404))
            else:
                await ws.close(code=4404, reason="pty session not found")
            return
        since_raw = ws.query_params.get("since")
        try:
            since = int(since_raw) if since_raw else 0
        except ValueError:
            since = 0
        if session.holder is not None and ws.query_params.get("takeover") != "1":
            body = {"code": "ALREADY_CONNECTED",
                    "message": f"another client is already connected to pty session {session.id}"}
            if "websocket.http.response" in ws.scope.get("extensions", {}):
                await ws.send_denial_response(JSON(body, status_code=409))
            else:
                await ws.close(code=4409, reason="ALREADY_CONNECTED")
            return
        await ws.accept()
        if session.holder is not None and not await self._take_over(session):
            await ws.send_json({"type": "error", "code": "ALREADY_CONNECTED",
                                "error": f"takeover timed out for pty session {session.id}"})
            await ws.close()
            return
        session.holder = ws
        session.released.clear()
        queue: asyncio.Queue[Frame | None] = asyncio.Queue(maxsize=QUEUE_FRAMES)
        try:
            data, start = session.replay(since)
            if data:
                await ws.send_bytes(bytes((BIN_REPLAY,)) + start.to_bytes(8, "big") + data)
            await ws.send_json({"type": "connected", "session_id": session.id, "mode": "pty"})
            session.clients.add(queue)
            if session.exit_code is not None and session.eof:
                queue.put_nowait({"type": "exit", "exit_code": session.exit_code})
            writer = asyncio.create_task(self._pump(ws, queue))
            try:
                while True:
                    message = await ws.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    raw = message.get("bytes")
                    if raw is not None:
                        if raw[:1] == bytes((BIN_STDIN,)) and session.running:
                            session.write(raw[1:])
                        continue
                    self._client_frame(session, message.get("text") or "", queue)
            finally:
                writer.cancel()
                with contextlib.suppress(BaseException):
                    await writer
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client went away (or was taken over) while we wrote
        finally:
            session.clients.discard(queue)
            if session.holder is ws:
                session.holder = None
                session.released.set()

    @staticmethod
    async def _take_over(session: PtySession) -> bool:
        """Close the attached client (4001 ``TAKEN_OVER``) and wait for it to let go."""
        holder = session.holder
        if holder is not None:
            with contextlib.suppress(Exception):
                await holder.close(code=CLOSE_TAKEN_OVER, reason="TAKEN_OVER")
        try:
            await asyncio.wait_for(session.released.wait(), TAKEOVER_WAIT)
        except TimeoutError:
            return False
        return session.holder is None

    def _client_frame(self, session: PtySession, text: str, queue: asyncio.Queue[Any]) -> None:
        import json

        def reply(frame: dict[str, Any]) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(frame)

        try:
            frame = json.loads(text)
            if not isinstance(frame, dict):
                raise ValueError("frame must be an object")
        except ValueError:
            reply(
                {"type": "error", "error": "frames must be JSON objects", "code": "INVALID_FRAME"}
            )
            return
        kind = frame.get("type")
        try:
            if kind == "stdin":
                if session.running:
                    session.write(str(frame.get("data", "")).encode())
            elif kind == "resize":
                session.resize(int(frame.get("rows") or 24), int(frame.get("cols") or 80))
            elif kind == "signal":
                session.signal(str(frame.get("signal") or "SIGINT"))
            elif kind == "ping":
                reply({"type": "pong"})
            else:
                reply(
                    {
                        "type": "error",
                        "error": f"unknown frame type {kind!r}",
                        "code": "INVALID_FRAME",
                    }
                )
        except (ValueError, OSError) as exc:
            reply({"type": "error", "error": str(exc), "code": "INVALID_FRAME"})

    async def _pump(self, ws: WebSocket, queue: asyncio.Queue[Frame | None]) -> None:
        while True:
            frame = await queue.get()
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
                continue
            if frame is None:
                await ws.send_json(
                    {
                        "type": "error",
                        "error": "client fell behind; reconnect with since",
                        "code": "LAGGING",
                    }
                )
                await ws.close(code=1013)
                return
            await ws.send_json(frame)
            if frame.get("type") == "exit":  # as the reference: then a normal close
                await ws.close(code=1000, reason="process exited")
                return
