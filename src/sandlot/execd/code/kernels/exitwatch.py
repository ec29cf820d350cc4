"""Exit statuses of kernel processes, also when execd reaps every child itself.

execd (often PID 1) collects all children with ``waitpid(-1)``, so ``Popen.poll`` and asyncio's
child watcher can no longer see how a kernel died; an out-of-memory SIGKILL would look like a
clean exit. Registering the pid with execd's reaper right after the spawn keeps the status.
"""

from __future__ import annotations

import asyncio


def watch_exit(pid: int | None) -> asyncio.Future[int] | None:
    """A future of the shell-style exit code (128+N for signal N) when execd's reaper runs."""
    if pid is None:
        return None
    try:
        from sandlot.execd import procs
    except ImportError:
        return None
    reaper = procs.REAPER
    if getattr(reaper, "_loop", None) is None:  # not running inside execd
        return None
    return reaper.watch(pid)


def returncode(future: asyncio.Future[int] | None, fallback: int | None) -> int | None:
    """Popen-style return code (negative signal number) from the reaper's status, if known."""
    if future is None or not future.done() or future.cancelled():
        return fallback
    code = future.result()
    return -(code - 128) if code > 128 else code
