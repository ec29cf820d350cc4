"""Go contexts: each cell is compiled with the context's earlier declarations and run once.

What persists (see :mod:`.gocell`): imports, types, functions, methods and package-level
variables and constants, including ``x := ...`` written at a cell's top level. Values do not
survive a run: a persisted variable's initializer runs again at the start of every later cell's
program, and assignments a cell makes last for that cell. A cell that does not compile changes
nothing. This is the model of the reference's Go kernel (gonb), which also recompiles per cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile

from sandlot.execd.oomscore import prefer_for_oom

from .. import identity
from .base import Emit, KernelDied, Output, describe_exit
from .exitwatch import returncode, watch_exit
from .gocell import GoState, split

_READ = 65536
_PANIC = re.compile(r"^panic: (.*)$", re.M)
_FILE_PREFIX = re.compile(r"^(?:\./|/\S+/)?main\.go:", re.M)


class GoKernel:
    """No process between runs: ``pid`` is the running program's, else ``None``."""

    def __init__(self, go: str, *, cwd: str | None, env: dict[str, str]):
        self.language = "go"
        self._go = go
        self._cwd = cwd
        self._env = dict(env)
        if "GOCACHE" not in self._env and "HOME" not in self._env:
            self._env["GOCACHE"] = os.path.join(tempfile.gettempdir(), "sandlot-go-cache")
        self._env.setdefault("GOFLAGS", "-mod=mod")
        self._env.setdefault("GO111MODULE", "auto")
        self._state = GoState()
        self._dir: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._interrupted = False
        self._count = 0
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def start(self, timeout: float) -> None:
        if not os.access(self._go, os.X_OK):
            raise KernelDied(None)
        self._dir = tempfile.mkdtemp(prefix="sandlot-go-")
        os.chmod(self._dir, 0o755)  # cells run as the image's user (identity), built by execd

    async def is_alive(self) -> bool:
        return self._dir is not None

    async def execute(self, code: str, emit: Emit) -> None:
        async with self._lock:
            assert self._dir is not None
            self._interrupted = False
            self._count += 1
            cell = split(code)
            state = self._state.with_cell(cell)
            body = cell.main if cell.main is not None else "\n".join(cell.body)
            source = os.path.join(self._dir, "main.go")
            binary = os.path.join(self._dir, "cell")
            with open(source, "w", encoding="utf-8") as fh:
                fh.write(state.program(body))
            built = await self._build(source, binary, emit)
            if built:
                self._state = state
                await self._run(binary, emit)
            emit(Output("count", count=self._count))

    async def _build(self, source: str, binary: str, emit: Emit) -> bool:
        proc = await asyncio.create_subprocess_exec(
            self._go, "build", "-o", binary, source, cwd=self._dir, env=self._env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        # execd reaps every child itself: its reaper, not asyncio, knows the exit status.
        exit_status = watch_exit(proc.pid)
        self._proc = proc
        try:
            output, _ = await proc.communicate()
        finally:
            await self._reap(proc)
        code = returncode(exit_status, proc.returncode)
        if self._interrupted:
            emit(_interrupted())
            return False
        if code == 0:
            return True
        lines = [
            _FILE_PREFIX.sub("line ", line) for line in output.decode(errors="replace").splitlines()
            if line and not line.startswith("# command-line-arguments")
        ]
        failed = f"go build failed ({describe_exit(code)})"
        emit(Output("error", ename="CompileError", evalue="; ".join(lines[:3]) or failed,
                    traceback=lines or [failed]))
        return False

    async def _run(self, binary: str, emit: Emit) -> None:
        # A cell's program can end within milliseconds, before execd's reaper (which reaps
        # every child) knows to keep its status; so a shell runs it and writes the status to a
        # pipe of ours (128+N for signal N, as shells report it).
        rfd, wfd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                # (/proc/self/fd/N, not >&N: dash takes single-digit fds only.)
                "/bin/sh", "-c", f'"$0"; echo "$?" >/proc/self/fd/{wfd}', binary,
                cwd=self._cwd or None, env=self._env, pass_fds=(wfd,),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
                **identity.popen_kwargs(),
            )
        finally:
            os.close(wfd)
        prefer_for_oom(proc.pid)
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        tail: list[str] = []
        try:
            await asyncio.gather(_forward(proc.stdout, "stdout", emit, None),
                                 _forward(proc.stderr, "stderr", emit, tail))
            await proc.wait()
            os.set_blocking(rfd, False)  # the shell has written its line, or never will
            try:
                status = os.read(rfd, 32)
            except BlockingIOError:
                status = b""
        finally:
            os.close(rfd)
            await self._reap(proc)
        text = status.decode(errors="replace").strip()
        # No status: the shell itself was killed (an OOM kill takes the whole group's memory).
        code = int(text) if text.isdigit() else 128 + signal.SIGKILL
        if self._interrupted:
            emit(_interrupted())
        elif code == 128 + signal.SIGKILL:
            raise KernelDied(-signal.SIGKILL)
        elif code:
            panic = _PANIC.search("".join(tail))
            if panic:
                emit(Output("error", ename="panic", evalue=panic.group(1),
                            traceback="".join(tail).splitlines()))
            else:
                emit(Output("error", ename="ExitError", evalue=f"exit status {code}"))

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        self._proc = None

    async def interrupt(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self._interrupted = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)

    async def shutdown(self) -> None:
        proc = self._proc
        if proc is not None:
            await self._reap(proc)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _interrupted() -> Output:
    return Output("error", ename="Interrupted", evalue="execution was interrupted",
                  traceback=["Interrupted: execution was interrupted"])


async def _forward(
    stream: asyncio.StreamReader, kind: str, emit: Emit, keep: list[str] | None
) -> None:
    while True:
        chunk = await stream.read(_READ)
        if not chunk:
            return
        text = chunk.decode("utf-8", "replace")
        if keep is not None:
            keep.append(text)
            del keep[:-64]
        emit(Output(kind, text=text))  # type: ignore[arg-type]
