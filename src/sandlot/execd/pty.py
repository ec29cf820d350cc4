"""Interactive terminals (``/pty``), the reference execd's extension routes:

- ``POST /pty`` ``{cwd?, command?, cols?, rows?, envs?}`` -> 201 ``{session_id}``: starts a
  login-less shell (or ``command`` through the shell) on a new pseudo-terminal.
- ``GET /pty/{id}`` -> ``{session_id, running, output_offset, exit_code}``.
- ``DELETE /pty/{id}``: kills the terminal's process group and forgets it.
- ``GET /pty/{id}/ws[?since=N]`` (WebSocket). Server frames are JSON: ``replay`` ``{data,
  offset}`` (buffered output from byte ``since``, default 0), ``connected`` ``{session_id,
  mode: "pty"}``, ``stdout`` ``{data, timestamp}``, ``exit`` ``{exit_code}``, ``pong``,
  ``error`` ``{error, code}``. Client frames: ``stdin`` ``{data}`` (binary frames are raw
  stdin too), ``resize`` ``{cols, rows}``, ``signal`` ``{signal: "SIGINT"}``, ``ping``.

A dropped WebSocket leaves the terminal running; reconnecting with ``since`` = the last
``offset``/byte count seen replays what was missed (up to the last ``RING_BYTES``).
"""

from __future__ import annotations

import asyncio
import codecs
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

from sandlot.execd import procs, sse
from sandlot.execd.commands import find_shell
from sandlot.execd.http import JSON, bad_request, expect_object, json_body, not_found, ok
from sandlot.execd.settings import Settings

RING_BYTES = 4 << 20
QUEUE_FRAMES = 4096


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
        self.clients: set[asyncio.Queue[dict[str, Any] | None]] = set()
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
        text = data.decode("utf-8", errors="replace")
        self._broadcast(
            {"type": "stdout", "data": text, "offset": self.offset, "timestamp": sse.now_ms()}
        )

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

    def _broadcast(self, frame: dict[str, Any]) -> None:
        for q in list(self.clients):
            try:
                q.put_nowait(frame)
            except asyncio.QueueFull:
                self.clients.discard(q)
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(None)  # tell that client's writer it fell behind

    def replay(self, since: int) -> tuple[bytes, int]:
        start = max(since, self.ring_start)
        return bytes(self.ring[start - self.ring_start :]), self.offset

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
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            raise bad_request(f"working directory does not exist: {cwd}")
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
        await ws.accept()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=QUEUE_FRAMES)
        data, offset = session.replay(since)
        if data:
            await ws.send_json(
                {"type": "replay", "data": data.decode("utf-8", errors="replace"), "offset": offset}
            )
        await ws.send_json(
            {"type": "connected", "session_id": session.id, "mode": "pty", "offset": offset}
        )
        session.clients.add(queue)
        if session.exit_code is not None and session.eof:
            queue.put_nowait({"type": "exit", "exit_code": session.exit_code})
        writer = asyncio.create_task(self._pump(ws, queue))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes") is not None:
                    session.write(message["bytes"])
                    continue
                self._client_frame(session, message.get("text") or "", queue, decoder)
        except WebSocketDisconnect:
            pass
        finally:
            session.clients.discard(queue)
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer

    def _client_frame(
        self, session: PtySession, text: str, queue: asyncio.Queue[Any], decoder: Any
    ) -> None:
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
                reply({"type": "pong", "timestamp": sse.now_ms()})
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

    async def _pump(self, ws: WebSocket, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        while True:
            frame = await queue.get()
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
