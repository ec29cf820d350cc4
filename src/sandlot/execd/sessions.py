"""Bash sessions (``/session``): one long-lived non-interactive bash per session, so the
working directory and exported variables persist between runs.

Each run's text is written to a file and sourced (``. file < /dev/null``) by the session's
bash, so it runs in the shell itself (``cd``/``export`` stick) but cannot read the control
pipe. After it, bash prints an end marker carrying ``$?`` on stdout and on stderr; output
before the marker belongs to the run. If the run calls ``exit``, the session ends and the
run reports bash's exit status.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandlot.errors import Conflict
from sandlot.execd import procs
from sandlot.execd.commands import READ_SIZE, CommandService, find_shell, make_pipe
from sandlot.execd.execution import Execution
from sandlot.execd.http import JSON, bad_request, expect_object, json_body, not_found, ok
from sandlot.execd.settings import Settings


class _Stream:
    """Splits one pipe's bytes into run output and end markers."""

    def __init__(self, name: str, marker: bytes) -> None:
        self.name = name
        self.marker = marker
        self.buf = b""

    def take(self, data: bytes) -> tuple[bytes, bytes | None]:
        """(output to forward, marker payload if a whole marker line is now buffered)."""
        self.buf += data
        idx = self.buf.find(self.marker)
        if idx >= 0:
            end = self.buf.find(b"\n", idx + len(self.marker))
            out, self.buf = self.buf[:idx], self.buf[idx:]
            if end < 0:
                return out, None
            end -= idx
            payload = self.buf[len(self.marker) : end]
            self.buf = self.buf[end + 1 :]
            return out, payload
        # Hold back only a tail that could be the start of a marker.
        hold = self.buf.rfind(self.marker[:1], max(0, len(self.buf) - len(self.marker) + 1))
        if hold >= 0 and self.marker.startswith(self.buf[hold:]):
            out, self.buf = self.buf[:hold], self.buf[hold:]
        else:
            out, self.buf = self.buf, b""
        return out, None


class BashSession:
    def __init__(self, service: SessionService, session_id: str, cwd: str) -> None:
        self.service = service
        self.id = session_id
        self.cwd = cwd
        self.loop = asyncio.get_running_loop()
        self.marker = f"\x1esandlot-end-{uuid.uuid4().hex}:".encode()
        self.dir = os.path.join(service.commands.state_dir, f"session-{session_id}")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = make_pipe()
        err_r, err_w = make_pipe()
        shell = find_shell()
        argv = [shell, "--noprofile", "--norc"] if shell.endswith("bash") else [shell]
        try:
            self.pid, self.exited = procs.spawn(
                argv,
                cwd=cwd,
                env=service.commands.base_env(),
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
            )
        finally:
            os.close(in_r)
            os.close(out_w)
            os.close(err_w)
        self.stdin = in_w
        self.streams = {
            out_r: _Stream("stdout", self.marker),
            err_r: _Stream("stderr", self.marker),
        }
        for fd in self.streams:
            self.loop.add_reader(fd, self._readable, fd)
        self.current: Execution | None = None
        self._markers: dict[str, bytes] = {}
        self._counter = 0
        self.lock = asyncio.Lock()
        self.exited.add_done_callback(self._on_exit)

    @property
    def alive(self) -> bool:
        return not self.exited.done()

    def _readable(self, fd: int) -> None:
        stream = self.streams[fd]
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(fd)
            os.close(fd)
            out, stream.buf = stream.buf, b""
            if self.current is not None and out:
                self.current.feed(stream.name, out)
            del self.streams[fd]
            self._check_done()
            return
        out, payload = stream.take(data)
        if out and self.current is not None:
            self.current.feed(stream.name, out)
        if payload is not None:
            self._markers[stream.name] = payload
        self._check_done()

    def _check_done(self) -> None:
        ex = self.current
        if ex is None:
            return
        names = {s.name for s in self.streams.values()}
        if all(n in self._markers for n in names) and "stdout" in self._markers:
            try:
                code = int(self._markers["stdout"].decode().strip() or "0")
            except ValueError:
                code = 255
            self._finish(code)
        elif not self.streams and self.exited.done():
            self._finish(self.exited.result(), ended=True)

    def _on_exit(self, _f: Any) -> None:
        if not self.streams:
            self._check_done()
        else:
            self.loop.call_later(0.2, self._check_done_after_exit)

    def _check_done_after_exit(self) -> None:
        if self.current is not None and self.current.running:
            self._finish(self.exited.result(), ended=True)

    def _finish(self, code: int, *, ended: bool = False) -> None:
        ex, self.current = self.current, None
        self._markers = {}
        if ex is None or not ex.running:
            return
        timed_out = ex.timed_out
        error = ex.error if timed_out else ("session ended" if ended and code != 0 else None)
        ex.finish(code, error=error, ename="CommandTimeout" if timed_out else "CommandExecError")
        ex.log.seal()

    def run(self, command: str, cwd: str | None, timeout_ms: int | None) -> Execution:
        if not self.alive:
            raise Conflict(f"session {self.id} has ended", code="SESSION_ENDED")
        if self.current is not None and self.current.running:
            raise Conflict(f"session {self.id} is busy with another run", code="SESSION_BUSY")
        ex = self.service.commands.new_execution(command, background=False)
        self._counter += 1
        script = os.path.join(self.dir, f"run-{self._counter}.sh")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(command)
            fh.write("\n")
        m = self.marker.decode()
        prologue = f"__sl_prev=$PWD; cd -- {shlex.quote(cwd)} || true; " if cwd else ""
        epilogue = ' cd -- "$__sl_prev";' if cwd else ""
        line = (
            f"{prologue}. {shlex.quote(script)} < /dev/null; __sl_ec=$?;{epilogue} "
            f"rm -f {shlex.quote(script)}; "
            f"printf '{m}%d\\n' \"$__sl_ec\"; printf '{m}%d\\n' \"$__sl_ec\" >&2\n"
        )
        self.current = ex
        try:
            os.write(self.stdin, line.encode())
        except OSError as exc:
            self._finish(255, ended=True)
            raise Conflict(f"session {self.id} has ended: {exc}", code="SESSION_ENDED") from None
        if timeout_ms:
            handle = self.loop.call_later(timeout_ms / 1000, self._timeout, ex, timeout_ms)
            ex.done.add_done_callback(lambda _f: handle.cancel())
        return ex

    def _timeout(self, ex: Execution, timeout_ms: int) -> None:
        if not ex.running:
            return
        ex.error = f"run timed out after {timeout_ms} ms"
        ex.timed_out = True
        self.loop.create_task(self._kill_run(ex))

    async def _kill_run(self, ex: Execution) -> None:
        """Kill the run's processes (bash's descendants) until its end marker arrives."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGKILL, signal.SIGKILL):
            if not ex.running:
                return
            for pid in _descendants(self.pid):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            try:
                await asyncio.wait_for(
                    asyncio.shield(ex.done), self.service.settings.interrupt_grace
                )
                return
            except TimeoutError:
                continue
        # Only bash itself is left running the script (a builtin loop): end the session.
        procs.kill_group(self.pid, signal.SIGKILL)

    def close(self) -> None:
        procs.kill_group(self.pid, signal.SIGKILL)
        try:
            os.close(self.stdin)
        except OSError:
            pass
        if self.current is not None:
            self._finish(137, ended=True)
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    result: list[int] = []
    todo = procs.list_children(pid)
    while todo:
        p = todo.pop()
        result.append(p)
        todo.extend(procs.list_children(p))
    return result


class SessionService:
    def __init__(self, settings: Settings, commands: CommandService) -> None:
        self.settings = settings
        self.commands = commands
        self.sessions: dict[str, BashSession] = {}

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        for s in list(self.sessions.values()):
            s.close()
        self.sessions.clear()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/session", self.create_route, methods=["POST"]),
            Route("/session/{sid}/run", self.run_route, methods=["POST"]),
            Route("/session/{sid}", self.delete_route, methods=["DELETE"]),
        ]

    async def create_route(self, request: Request) -> Response:
        body = await json_body(request, required=False)
        data = expect_object(body) if body is not None else {}
        cwd = data.get("cwd") or self.settings.workdir
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            raise bad_request(f"working directory does not exist: {cwd}")
        sid = uuid.uuid4().hex
        self.sessions[sid] = BashSession(self, sid, cwd)
        return JSON({"session_id": sid})

    def get(self, sid: str) -> BashSession:
        session = self.sessions.get(sid)
        if session is None:
            raise not_found(f"session {sid} not found", code="SESSION_NOT_FOUND")
        return session

    async def run_route(self, request: Request) -> Response:
        session = self.get(request.path_params["sid"])
        data = expect_object(await json_body(request))
        command = data.get("command")
        if not isinstance(command, str) or not command.strip():
            raise bad_request("'command' (non-empty string) is required")
        cwd = data.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not os.path.isdir(cwd)):
            raise bad_request(f"working directory does not exist: {cwd}")
        timeout = data.get("timeout")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0
        ):
            raise bad_request("'timeout' must be a non-negative integer (milliseconds)")
        ex = session.run(command, cwd, timeout or None)
        return self.commands.stream(ex)

    async def delete_route(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        session = self.get(sid)
        self.sessions.pop(sid, None)
        session.close()
        return ok()
