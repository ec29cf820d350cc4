"""Child processes of execd: spawning in their own process group, reaping, and group kills.

execd is often PID 1 of a sandbox, so it must reap every zombie, including orphans that
were re-parented to it. One SIGCHLD handler therefore calls ``waitpid(-1)`` and hands each
exit status to whoever registered that pid (``Reaper.watch``); statuses of unknown pids
(orphans) are simply dropped. Everything in execd that spawns a process should use
``spawn`` (or ``Reaper.watch`` right after its own fork, with no ``await`` in between) so
the status is not lost.

When not PID 1, execd makes itself a child subreaper so that daemonised grandchildren
(``cmd &`` inside a command) are still reaped and killed at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from sandlot.execd.oomscore import prefer_child

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def exit_code_from_status(status: int) -> int:
    """Shell convention: normal exit -> its code, killed by signal N -> 128 + N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


def become_undumpable() -> bool:
    """Clear the dumpable flag: the workload (root in the sandbox, without CAP_SYS_PTRACE)
    can then neither ptrace execd nor read its /proc files (environ, memory, fds)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Ask the kernel to re-parent our orphaned descendants to us (Linux only)."""
    if os.getpid() == 1:
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Reaper:
    """Collects exit statuses of all children on SIGCHLD and resolves per-pid futures."""

    def __init__(self) -> None:
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._status_waiters: dict[int, asyncio.Future[int]] = {}
        self._groups: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def uninstall(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_signal_handler(signal.SIGCHLD)

    def watch(self, pid: int) -> asyncio.Future[int]:
        """A future resolving to the pid's exit code (see ``exit_code_from_status``)."""
        loop = self._loop or asyncio.get_running_loop()
        fut = self._waiters.get(pid)
        if fut is None:
            fut = loop.create_future()
            self._waiters[pid] = fut
        return fut

    def watch_status(self, pid: int) -> asyncio.Future[int]:
        """A future resolving to the pid's raw wait status (to tell a signal from an exit
        code); ask right after spawning, before the loop runs again."""
        loop = self._loop or asyncio.get_running_loop()
        fut = self._status_waiters.get(pid)
        if fut is None:
            fut = loop.create_future()
            self._status_waiters[pid] = fut
        return fut

    def track_group(self, pgid: int) -> None:
        self._groups.add(pgid)

    def untrack_group(self, pgid: int) -> None:
        self._groups.discard(pgid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:  # pragma: no cover - EINTR is retried by Python
                if exc.errno == errno.EINTR:
                    continue
                return
            if pid == 0:
                return
            raw = self._status_waiters.pop(pid, None)
            if raw is not None and not raw.done():
                raw.set_result(status)
            fut = self._waiters.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result(exit_code_from_status(status))

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signal every tracked process group, then every remaining descendant."""
        for pgid in list(self._groups):
            kill_group(pgid, sig)
        for pid in list_children(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def list_children(ppid: int) -> list[int]:
    """Direct children of ``ppid`` (via /proc/<ppid>/task/*/children)."""
    result: list[int] = []
    task_dir = f"/proc/{ppid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return result
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/children") as fh:
                result.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return result


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


REAPER = Reaper()


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    stdin: Any = subprocess.DEVNULL,
    stdout: Any = None,
    stderr: Any = None,
    uid: int | None = None,
    gid: int | None = None,
    pass_fds: Sequence[int] = (),
    preexec_fn: Any = None,
    start_new_session: bool = True,
) -> tuple[int, asyncio.Future[int]]:
    """Start ``argv`` as the leader of a new session/process group; returns (pid, exit future).

    ``subprocess.Popen`` is used for its fork/exec plumbing only; its own wait is never
    used because the reaper owns every exit status.
    """
    kwargs: dict[str, Any] = {}
    if uid is not None:
        kwargs["user"] = uid
        kwargs["extra_groups"] = []
    if gid is not None:
        kwargs["group"] = gid
    proc = subprocess.Popen(  # noqa: S603 - argv comes from the authenticated API user
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        start_new_session=start_new_session and preexec_fn is None,
        preexec_fn=preexec_fn,
        **kwargs,
    )
    # The reaper owns the status: mark the Popen as finished so it never waits itself.
    proc.returncode = 0
    # Before it forks further, so all it starts inherits it (see oomscore for why).
    prefer_child(proc.pid)
    fut = REAPER.watch(proc.pid)
    REAPER.track_group(proc.pid)
    pgid = proc.pid

    def forget(_f: asyncio.Future[int]) -> None:
        _forget_group_later(pgid)

    fut.add_done_callback(forget)
    return proc.pid, fut


def _forget_group_later(pgid: int) -> None:
    # The leader is gone; keep tracking the group while members survive it.
    if not group_alive(pgid):
        REAPER.untrack_group(pgid)


async def kill_group_until_gone(pgid: int, limit: float = 30.0) -> bool:
    """SIGKILL a group again and again until it has no member (a fork bomb adds members
    between two kills); False if some survive ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while kill_group(pgid, signal.SIGKILL):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    REAPER.untrack_group(pgid)
    return True


async def terminate_group(
    pgid: int,
    exited: asyncio.Future[int] | None,
    *,
    first: int = signal.SIGINT,
    grace: float = 3.0,
    signals: Sequence[int] | None = None,
) -> None:
    """Signal the whole group with each of ``signals`` (default ``first``, SIGTERM, SIGKILL),
    ``grace`` s apart, stopping as soon as the leader has exited and the group is gone. A
    SIGKILL is repeated until the group is empty (a fork bomb adds members between kills)."""
    sequence = tuple(signals) if signals else (first, signal.SIGTERM, signal.SIGKILL)
    for sig in sequence:
        if sig == signal.SIGKILL:
            await kill_group_until_gone(pgid)
            break
        if not kill_group(pgid, sig):
            break
        deadline = asyncio.get_running_loop().time() + grace
        while asyncio.get_running_loop().time() < deadline:
            leader_done = exited is None or exited.done()
            if leader_done and not group_alive(pgid):
                return
            await asyncio.sleep(0.02)
    REAPER.untrack_group(pgid)
