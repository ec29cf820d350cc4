"""``/command``: run shell text or an argv, stream it as SSE, background runs, status, logs,
interrupt. Output is read straight from the pipes by the event loop (``add_reader``), so
an event is on the wire as soon as the process writes it, and the stream ends when both
pipes are at EOF and the exit status is known (no fixed grace delay).

Streams are in the reference's framing unless the client asks for standard SSE (``?sse=1``;
see ``sse``). Extensions beyond the contract (sandlot's): ``GET /command/{id}/stream``
re-attaches to an execution's event stream (SSE framing); with ``Last-Event-ID`` (or
``?after=<id>``) it continues after that event, so a dropped stream loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from sandlot.errors import RuntimeFailure
from sandlot.execd import memory, oomscore, paths, plainexec, procs, sse
from sandlot.execd.envfile import EnvFile
from sandlot.execd.execution import Execution, describe_status
from sandlot.execd.http import (
    JSON,
    bad_request,
    expect_object,
    json_body,
    missing_query,
    not_found,
    ok,
    query_int,
)
from sandlot.execd.settings import Settings
from sandlot.execd.sparefiles import SpareFiles

MAX_ID = 2**32 - 2  # the largest uid/gid Linux accepts ((uid_t)-1 means "unchanged")
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000  # 10 years; larger ones overflow timers

F_SETPIPE_SZ = 1031
F_GETPIPE_SZ = 1032
PIPE_SIZE = 1 << 20
READ_SIZE = 256 * 1024
# Output batching of fast commands (see _PipeWatch): a read of HOT_READ bytes or more pauses
# reading that pipe for BATCH_DELAY s; then up to BATCH_READ_SIZE bytes make one event. Only
# for pipes of BATCH_MIN_PIPE bytes or more (a small pipe would block the writer meanwhile).
HOT_READ = 4096
BATCH_DELAY = 0.001
BATCH_READ_SIZE = PIPE_SIZE
BATCH_MIN_PIPE = 256 * 1024
BIG_OUTPUT = 4 << 20  # output size after which execd trims its heap (see memory.py)


def find_shell() -> str:
    for candidate in ("/bin/bash", "/usr/bin/bash", "/bin/sh", "/usr/bin/sh"):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("bash") or shutil.which("sh") or "/bin/sh"


def make_pipe() -> tuple[int, int]:
    """A pipe whose read end is non-blocking and as large as the kernel allows (throughput)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(r, F_SETPIPE_SZ, PIPE_SIZE)
    os.set_blocking(r, False)
    return r, w


def pipe_size(fd: int) -> int:
    try:
        return int(fcntl.fcntl(fd, F_GETPIPE_SZ))
    except OSError:
        return 0


class CommandRequest:
    """A validated ``RunCommandRequest`` (``command`` or ``argv``, plus options)."""

    def __init__(self, body: Any, default_cwd: str) -> None:
        data = expect_object(body)
        command, argv = data.get("command"), data.get("argv")
        if argv is not None:
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise bad_request("'argv' must be a non-empty list of strings")
            if not argv[0] or any("\0" in a for a in argv):
                raise bad_request("'argv' needs a non-empty executable and no NUL bytes")
        elif not isinstance(command, str) or not command.strip():
            raise bad_request("'command' (non-empty string) or 'argv' is required")
        elif "\0" in command:
            raise bad_request("'command' must not contain NUL bytes")
        self.command: str | None = command if argv is None else None
        self.argv: list[str] | None = argv
        self.background = bool(data.get("background") or False)
        timeout = data.get("timeout")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0
        ):
            raise bad_request("'timeout' must be a non-negative integer (milliseconds)")
        if timeout is not None and timeout > MAX_TIMEOUT_MS:
            raise bad_request(f"'timeout' {timeout} is out of range: at most {MAX_TIMEOUT_MS} ms")
        self.timeout_ms: int | None = timeout or None
        envs = data.get("envs") or {}
        if not isinstance(envs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
        ):
            raise bad_request("'envs' must be an object of string values")
        self.envs: dict[str, str] = envs
        cwd = data.get("cwd") or default_cwd
        if not isinstance(cwd, str):
            raise bad_request("'cwd' must be a string")
        cwd = paths.expand(cwd, envs)  # ~ and $VAR, as the reference
        if not os.path.isdir(cwd):
            raise bad_request(f"working directory does not exist: {data.get('cwd')}")
        self.cwd = cwd
        uid, gid = data.get("uid"), data.get("gid")
        for name, value in (("uid", uid), ("gid", gid)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
                or value > MAX_ID
            ):
                raise bad_request(f"'{name}' must be an integer from 0 to {MAX_ID}")
        if gid is not None and uid is None:
            raise bad_request("'gid' requires 'uid'")
        self.uid: int | None = uid
        self.gid: int | None = gid

    @property
    def content(self) -> str:
        if self.argv is not None:
            import shlex

            return shlex.join(self.argv)
        return self.command or ""


class CommandService:
    """Owns every command execution of this execd and its on-disk journals."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.shell = find_shell()
        self._shell_is_bash = os.path.basename(self.shell) == "bash"
        self.executions: dict[str, Execution] = {}
        self._groups: dict[str, int] = {}
        self._exits: dict[str, asyncio.Future[int]] = {}
        self._own_state_dir = False
        self.state_dir = ""
        self._spare_files: SpareFiles | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._retained = asyncio.Event()  # set when an execution is kept: the janitor's work
        self.envfile = EnvFile(os.environ.get("EXECD_ENVS"))
        # Other things ``DELETE /command?id=`` reaches (bash sessions); True when it did.
        self.interrupt_other: Callable[[str], Awaitable[bool]] | None = None

    # lifecycle -----------------------------------------------------------------------
    async def startup(self) -> None:
        memory.tune()
        oomscore.remember_child_adj()
        if self.settings.state_dir:
            os.makedirs(self.settings.state_dir, exist_ok=True)
            self.state_dir = tempfile.mkdtemp(prefix="exec-", dir=self.settings.state_dir)
        else:
            self.state_dir = tempfile.mkdtemp(prefix="sandlot-execd-")
        self._own_state_dir = True
        self._spare_files = SpareFiles(self.state_dir)
        if not os.environ.get("EXECD_ENVS"):
            os.environ["EXECD_ENVS"] = os.path.join(self.state_dir, "envs")
            self.envfile = EnvFile(os.environ["EXECD_ENVS"])
        self._janitor = asyncio.create_task(self._expire_loop())

    async def shutdown(self) -> None:
        if self._janitor:
            self._janitor.cancel()
        for pgid in self._groups.values():
            procs.kill_group(pgid, signal.SIGKILL)
        for ex in list(self.executions.values()):
            ex.discard()
        self.executions.clear()
        if self._spare_files is not None:
            self._spare_files.close()
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    async def _expire_loop(self) -> None:
        while True:
            if not self.executions:  # nothing to expire: no timer while idle
                self._retained.clear()
                await self._retained.wait()
            await asyncio.sleep(min(30.0, max(1.0, self.settings.retention_seconds / 4)))
            self.expire()

    def expire(self) -> None:
        now = time.time()
        finished = sorted(
            (ex for ex in self.executions.values() if ex.finished_at is not None),
            key=lambda ex: ex.finished_at or 0,
        )
        excess = max(0, len(self.executions) - self.settings.max_retained)
        for ex in finished:
            old = now - (ex.finished_at or now) > self.settings.retention_seconds
            if old or excess > 0:
                excess -= 1
                self.executions.pop(ex.id, None)
                ex.discard()

    # environment ---------------------------------------------------------------------
    def base_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.envfile.values())
        if extra:
            env.update(extra)
        return env

    # running -------------------------------------------------------------------------
    def new_execution(
        self, content: str, *, background: bool, session_lines: bool = False,
        init_id: str | None = None,
    ) -> Execution:
        ex = Execution(uuid.uuid4().hex, content, self.state_dir, background=background,
                       files=self._spare_files, session_lines=session_lines, init_id=init_id,
                       max_journal_bytes=(self.settings.max_journal_bytes if background
                                          else self.settings.max_foreground_journal_bytes))
        self.executions[ex.id] = ex
        self._retained.set()
        return ex

    def start(self, req: CommandRequest) -> Execution:
        if req.uid is None and self.settings.default_uid is not None:  # the image's User
            req.uid, req.gid = self.settings.default_uid, self.settings.default_gid
        ex = self.new_execution(req.content, background=req.background)
        env = self.base_env(req.envs)
        argv = req.argv if req.argv is not None else [self.shell, "-c", req.command or ""]
        out_r, out_w = make_pipe()
        err_r, err_w = make_pipe()
        try:
            pid, exited = self._spawn_command(req, argv, env, out_w, err_w)
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            ex.feed("stderr", f"execd: {argv[0]}: {exc.strerror or exc}\n".encode())
            ex.finish(code, error=f"cannot start {argv[0]}: {exc.strerror or exc}")
            ex.log.seal()
            return ex
        except (ValueError, KeyError) as exc:  # bad uid/gid and the like
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise bad_request(str(exc)) from None
        os.close(out_w)
        os.close(err_w)
        self.watch(ex, pid, exited, out_r, err_r)
        if req.timeout_ms:
            loop = asyncio.get_running_loop()
            handle = loop.call_later(req.timeout_ms / 1000, self._on_timeout, ex, req.timeout_ms)
            # Kept when the command ends while processes of its group live on (``cmd &``, a
            # fork bomb): the timeout bounds the whole group, not only its leader.
            ex.done.add_done_callback(
                lambda _f: None if procs.group_alive(pid) else handle.cancel())
        return ex

    def _spawn_command(
        self, req: CommandRequest, argv: list[str], env: dict[str, str], out_w: int, err_w: int
    ) -> tuple[int, asyncio.Future[int]]:
        """Start the command; a plain one without bash in between (see ``plainexec``)."""
        if req.command is not None and self._shell_is_bash:
            plain = plainexec.plain_argv(req.command, env)
            direct_env = plainexec.bash_like_env(env, plain, req.cwd) if plain else None
            if plain and direct_env is not None:
                try:
                    return procs.spawn(plain, cwd=req.cwd, env=direct_env, stdout=out_w,
                                       stderr=err_w, uid=req.uid, gid=req.gid)
                except OSError:
                    pass  # not executable, no #! line, ...: bash says what it says about it
        return procs.spawn(argv, cwd=req.cwd, env=env, stdout=out_w, stderr=err_w,
                           uid=req.uid, gid=req.gid)

    def watch(
        self, ex: Execution, pid: int, exited: asyncio.Future[int], out_r: int,
        err_r: int | None, on_finished: Callable[[Execution], None] | None = None,
    ) -> None:
        """Feed ``ex`` from a just-spawned process's pipes (``err_r`` None: stderr shares
        stdout's pipe) and finish it when it ends; the process group is then reachable by
        ``find_running_group``/``kill_running``."""
        status = procs.REAPER.watch_status(pid)
        ex.pid = pid
        self._groups[ex.id] = pid
        self._exits[ex.id] = exited

        def finished(done: Execution) -> None:
            self._on_finished(done)
            if on_finished is not None:
                on_finished(done)

        _PipeWatch(ex, out_r, err_r, status, self.settings.drain_after_exit, finished)

    def kill_running(self, exec_id: str) -> None:
        """SIGKILL a running execution's process group (timeouts, closing sessions)."""
        group = self.find_running_group(exec_id)
        if group is not None:
            procs.kill_group(group[0], signal.SIGKILL)

    def _on_finished(self, ex: Execution) -> None:
        self._exits.pop(ex.id, None)
        pgid = self._groups.pop(ex.id, None)
        if pgid is not None and not procs.group_alive(pgid):
            procs.REAPER.untrack_group(pgid)

    def _on_timeout(self, ex: Execution, timeout_ms: int) -> None:
        """As the reference: a timed-out command's group is killed (SIGKILL) at once; it then
        ends with exit code -1 and ``signal: killed``."""
        if not ex.running:
            pgid = ex.pid
            # Its leader is gone; what is left of its group is killed. (A pid reused as the
            # leader of a newer command is that command's, and left alone.)
            if pgid and pgid not in self._groups.values() and procs.group_alive(pgid):
                asyncio.get_running_loop().create_task(procs.kill_group_until_gone(pgid))
            return
        ex.timed_out = True
        self.kill_running(ex.id)

    def find_running_group(self, exec_id: str) -> tuple[int, asyncio.Future[int] | None] | None:
        """(process group, leader's exit future) of a running execution, else None."""
        ex = self.executions.get(exec_id)
        pgid = self._groups.get(exec_id)
        if ex is None or pgid is None or not ex.running:
            return None
        return pgid, self._exits.get(exec_id)

    async def interrupt(self, exec_id: str) -> None:
        """The reference's interrupt: SIGTERM to the group, SIGKILL if it is still there after
        the grace (3 s); returns once the group is gone. ``RuntimeFailure`` (500, as the
        reference) when there is no such running command."""
        if exec_id not in self.executions:
            raise RuntimeFailure(
                "error interruptting code context. no such session", code="RUNTIME_ERROR"
            )
        group = self.find_running_group(exec_id)
        if group is None:
            raise RuntimeFailure(
                f"error interruptting code context. command session {exec_id} is not running",
                code="RUNTIME_ERROR",
            )
        pgid, exited = group
        await procs.terminate_group(
            pgid, exited, signals=(signal.SIGTERM, signal.SIGKILL),
            grace=self.settings.interrupt_grace,
        )
        ex = self.executions.get(exec_id)
        if ex is not None and ex.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(ex.done), self.settings.interrupt_grace)

    # streaming -----------------------------------------------------------------------
    def stream(
        self, ex: Execution, last_event_id: str | None = None, *, sse_frames: bool = False
    ) -> StreamingResponse:
        """The execution's events (the reference's framing unless ``sse_frames``)."""
        start = ex.journal.resume_offset(last_event_id)
        return sse.self_ending_sse_response(
            ex.journal.follow(start, keepalive=self.settings.keepalive_interval or None,
                              sse_frames=sse_frames),
            after=self._spare_files.top_up if self._spare_files is not None else None,
        )

    # routes --------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        return [
            Route("/command", self.run_route, methods=["POST"]),
            Route("/command", self.interrupt_route, methods=["DELETE"]),
            Route("/command/status/{id}", self.status_route, methods=["GET"]),
            Route("/command/{id}/logs", self.logs_route, methods=["GET"]),
            Route("/command/{id}/stream", self.stream_route, methods=["GET"]),
        ]

    def get(self, exec_id: str) -> Execution:
        """The execution; 404 as the reference answers an unknown id (its code included)."""
        ex = self.executions.get(exec_id)
        if ex is None:
            raise not_found(f"command not found: {exec_id}", code="INVALID_REQUEST_BODY")
        return ex

    async def run_route(self, request: Request) -> Response:
        req = CommandRequest(await json_body(request), self.settings.workdir)
        ex = self.start(req)
        framing = sse.wants_sse(request)
        if req.background:
            frames = [
                sse.encode(sse.init_event(ex.id), event_id=0, sse=framing),
                sse.encode(sse.complete_event(0), sse=framing),
            ]
            return sse.self_ending_sse_response(_iterate(frames))
        return self.stream(ex, sse_frames=framing)

    async def interrupt_route(self, request: Request) -> Response:
        """``DELETE /command?id=``: as the reference, the id may also be a bash session's,
        which closes that session (see ``interrupt_other``)."""
        exec_id = request.query_params.get("id")
        if not exec_id:
            raise missing_query("id")
        if exec_id not in self.executions and self.interrupt_other is not None:
            if await self.interrupt_other(exec_id):
                return ok()
        await self.interrupt(exec_id)
        return ok()

    async def status_route(self, request: Request) -> Response:
        return JSON(self.get(request.path_params["id"]).status())

    async def logs_route(self, request: Request) -> Response:
        exec_id = request.path_params["id"]
        ex = self.executions.get(exec_id)
        if ex is None:  # the reference answers 400 here
            raise bad_request(f"command not found: {exec_id}")
        cursor = query_int(request, "cursor", minimum=0)
        start, end, next_cursor = ex.log.read_from_line(cursor, finished=not ex.running)
        return StreamingResponse(
            ex.log.iter_range(start, end),
            media_type="text/plain; charset=utf-8",
            headers={
                "EXECD-COMMANDS-TAIL-CURSOR": str(next_cursor),
                "Content-Length": str(end - start),
            },
        )

    async def stream_route(self, request: Request) -> Response:
        ex = self.get(request.path_params["id"])
        last = sse.last_event_id(request) or request.query_params.get("after")
        return self.stream(ex, last, sse_frames=True)


async def _iterate(frames: list[bytes]) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame


class _PipeWatch:
    """Feeds an execution from its stdout/stderr pipes and finishes it at the right time.

    A read right after a quiet spell is fed at once (first-byte latency). A read that found
    ``HOT_READ`` bytes or more means the command writes faster than execd wakes up: reading
    that pipe then pauses for ``BATCH_DELAY`` so the next read takes what accumulated in the
    (1 MiB) pipe as one event; per-event work (journal line, SSE frame, the client's parse)
    otherwise dominates a fast stream. The pause ends at the first read that finds the pipe
    empty, so it only ever delays output that follows other output by at most the delay.
    A read that took a whole pipe is not followed by a pause: nothing more can gather, and
    the writer is blocked on the full pipe meanwhile (with the pause, a 128 MiB stream of
    short lines ran at 207-218 MB/s against 236-239 without it, docs/benchmarks.md).
    """

    def __init__(
        self,
        ex: Execution,
        out_fd: int,
        err_fd: int | None,
        exited: asyncio.Future[int],
        drain_after_exit: float,
        on_finished: Any,
    ) -> None:
        self.ex = ex
        self.loop = asyncio.get_running_loop()
        self.open = {out_fd: "stdout"}
        if err_fd is not None:
            self.open[err_fd] = "stderr"
        self.exited = exited
        self.drain_after_exit = drain_after_exit
        self.on_finished = on_finished
        self._drain_timer: asyncio.TimerHandle | None = None
        self._listening: set[int] = set()
        self._paused: dict[int, asyncio.TimerHandle] = {}
        # Pipes not read until the slowest stream reader catches up (journal backpressure).
        self._held: set[int] = set()
        # Batching only where the pipe can hold what arrives during a pause; the size of a
        # batched read (0: not batched), which also says when the pipe was full.
        self._batch = {fd: min(size, BATCH_READ_SIZE) if size >= BATCH_MIN_PIPE else 0
                       for fd, size in ((fd, pipe_size(fd)) for fd in self.open)}
        for fd in self.open:
            self._listen(fd)
        exited.add_done_callback(self._on_exit)

    def _listen(self, fd: int) -> None:
        if fd not in self._listening:
            self.loop.add_reader(fd, self._read, fd)
            self._listening.add(fd)

    def _unlisten(self, fd: int) -> None:
        if fd in self._listening:
            self.loop.remove_reader(fd)
            self._listening.discard(fd)

    def _resume(self, fd: int) -> None:
        self._paused.pop(fd, None)
        if fd in self.open:
            self._read(fd)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, self._batch[fd] or READ_SIZE)
        except BlockingIOError:
            self._listen(fd)
            return
        except OSError:
            data = b""
        if data:
            self.ex.feed(self.open[fd], data)
            journal = self.ex.journal
            if journal.backlog() > journal.backpressure_bytes:
                self._unlisten(fd)
                self._held.add(fd)
                journal.when_drained(functools.partial(self._release_soon, fd))
            elif HOT_READ <= len(data) < self._batch[fd]:
                self._unlisten(fd)
                self._paused[fd] = self.loop.call_later(BATCH_DELAY, self._resume, fd)
            else:
                self._listen(fd)
            return
        self._unlisten(fd)
        timer = self._paused.pop(fd, None)
        if timer is not None:
            timer.cancel()
        os.close(fd)
        del self.open[fd]
        if not self.open:
            if self.ex.log.size >= BIG_OUTPUT:
                memory.trim_soon()
            self._maybe_finish()
            if self.ex.finished_at is not None:
                self.ex.log.seal()

    def _release_soon(self, fd: int) -> None:
        self.loop.call_soon(self._release, fd)

    def _release(self, fd: int) -> None:
        self._held.discard(fd)
        if fd in self.open:
            self._read(fd)

    def _on_exit(self, _fut: asyncio.Future[int]) -> None:
        if not self.open:
            self._maybe_finish()
        else:
            # Descendants may still hold the pipes; give them a moment, then end anyway.
            self._drain_timer = self.loop.call_later(
                self.drain_after_exit, self._maybe_finish, True
            )

    def _maybe_finish(self, forced: bool = False) -> None:
        if not self.exited.done() or self.ex.finished_at is not None:
            return
        if self.open and not forced:
            return
        if forced and self._held:  # output still waits for a slow reader: not lost, later
            self._drain_timer = self.loop.call_later(
                self.drain_after_exit, self._maybe_finish, True
            )
            return
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        code, message = describe_status(self.exited.result())
        self.ex.finish(code, error=message if code != 0 else None)
        self.on_finished(self.ex)
        if not self.open:
            self.ex.log.seal()
