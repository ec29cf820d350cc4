"""Running host tools (runc, ip) from the server without stalling its event loop.

The server runs on uvloop, whose subprocess support ``fork()``s the whole server: the page
tables of a process with a few hundred MB mapped are copied before the tool starts, on the
event loop, ~5-12 ms per call (measured). CPython's ``subprocess`` uses ``vfork()`` (no copy,
~0.3 ms of CPU), so tools are started and waited for by ``subprocess.Popen`` on a thread
pool of their own; the loop only awaits the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

# Each running tool holds one thread while it runs; creates and deletes of many sandboxes at
# once run that many tools at once.
MAX_PARALLEL_TOOLS = 64

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(MAX_PARALLEL_TOOLS, thread_name_prefix="sandlot-tool")
    return _pool


@dataclass(frozen=True)
class ToolResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class _Job:
    """One tool run on a pool thread; ``cancel()`` kills it, or stops it before it starts."""

    def __init__(self, argv: list[str], out: IO[bytes] | int, timeout: float | None,
                 stdin: int | None = None) -> None:
        self.argv = argv
        self.stdin = subprocess.DEVNULL if stdin is None else stdin
        self.out = out
        self.timeout = timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cancelled = False

    def run(self) -> ToolResult:
        name = self.argv[0]
        with self._lock:
            if self._cancelled:
                return ToolResult(-9, b"", f"{name} cancelled before it started".encode())
            try:
                self._proc = subprocess.Popen(  # noqa: S603 - argv is built by sandlot
                    self.argv, stdin=self.stdin, stdout=self.out,
                    stderr=subprocess.PIPE if self.out == subprocess.PIPE else self.out,
                    start_new_session=True,  # a kill reaches the tool's own children too
                )
            except FileNotFoundError as exc:
                return ToolResult(127, b"", f"{name}: {exc.strerror}".encode())
        proc = self._proc
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)
            proc.communicate()
            return ToolResult(-9, b"", f"{name} timed out after {self.timeout}s".encode())
        return ToolResult(proc.returncode, out or b"", err or b"")

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None:
                self._kill_group(self._proc)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        # The tool leads its own session and group (pgid == pid), and that pid cannot be
        # reused before this Popen reaps it.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


async def run_tool(
    argv: list[str], *, output: IO[bytes] | None = None, timeout: float | None = None,
    stdin: int | None = None,
) -> ToolResult:
    """Run ``argv`` to completion; stdout/stderr captured, or both written to ``output``.

    ``stdin`` is a file descriptor for the tool's standard input (default /dev/null).

    A missing binary is returned as exit code 127 with a message, like a shell would. A
    cancelled caller kills the tool and waits for it: a ``runc run`` finishing behind the
    back of the teardown that followed the cancellation would leak a container.
    """
    loop = asyncio.get_running_loop()
    job = _Job(argv, output if output is not None else subprocess.PIPE, timeout, stdin)
    fut = loop.run_in_executor(_executor(), job.run)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        job.cancel()
        await asyncio.wait([fut])
        raise
