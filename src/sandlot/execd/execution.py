"""One execution (a command or a session run): its output, events, status and end.

Output bytes go to an ``OutputLog`` (for ``/command/{id}/logs``) and, framed into lines as
the reference execd frames them (``lines.LineFramer``), to one stdout/stderr event per line in
an ``EventJournal``. ``finish`` appends the final event, as the reference does: on success
``execution_complete``; on failure only ``error`` (``CommandExecError``, ``evalue`` = the
exit code, which the SDK turns into ``exit_code``; ``-1`` after a signal, as Go's
``ExitCode()``; traceback = Go's ``ExitError`` text such as ``exit status 3`` or
``signal: killed``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sandlot.execd import sse
from sandlot.execd.journal import DEFAULT_MAX_BYTES, EventJournal, OutputLog
from sandlot.execd.lines import LineFramer
from sandlot.execd.sparefiles import SpareFiles

# An execution's journals stay in memory while each holds at most this much: a command that
# prints a few lines creates no file (segments.py says why that matters). At most
# ``max_retained`` finished executions are kept, so this bounds what they hold in memory
# (2000 x 2 x 4 KiB = 16 MiB at the defaults, for 15 minutes after a burst of commands).
IN_MEMORY_BYTES = 4096


def describe_status(status: int) -> tuple[int, str]:
    """(exit code, message) of a raw wait status, as Go's ``ExitError`` reports them: a
    signalled process has exit code -1 and the message ``signal: <name>``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = (signal.strsignal(sig) or f"signal {sig}").lower()
        core = " (core dumped)" if os.WCOREDUMP(status) else ""
        return -1, f"signal: {name}{core}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255
    return code, f"exit status {code}"


def rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


class Execution:
    def __init__(
        self, exec_id: str, content: str, state_dir: str, *, background: bool,
        files: SpareFiles | None = None, session_lines: bool = False,
        init_id: str | None = None, max_journal_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        """``session_lines``: frame output as the reference frames session runs (see
        ``lines``); ``init_id``: the id the init event carries (a session run's is the
        session's id), default the execution's own."""
        self.id = exec_id
        self.content = content
        self.background = background
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.finished_at: float | None = None
        self.exit_code: int | None = None
        self.error: str | None = None
        self.timed_out = False
        self.pid: int | None = None
        # Files are named only when the output outgrows memory (segments.py): then from
        # the files made ahead (sparefiles.py) if there are any.
        journal_path: Callable[[], str] = (
            files.take if files is not None
            else lambda: os.path.join(state_dir, f"{exec_id}.events"))
        log_path: Callable[[], str] = (
            files.take if files is not None
            else lambda: os.path.join(state_dir, f"{exec_id}.log"))
        self.journal = EventJournal(journal_path, max_journal_bytes,
                                    in_memory_up_to=IN_MEMORY_BYTES)
        self.log = OutputLog(log_path, max_journal_bytes, in_memory_up_to=IN_MEMORY_BYTES)
        self._framers = {
            "stdout": LineFramer(session=session_lines),
            "stderr": LineFramer(session=session_lines),
        }
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.journal.append(sse.init_event(init_id or exec_id))

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def feed(self, stream: str, data: bytes) -> None:
        """Record output of ``stream`` ("stdout" | "stderr")."""
        if not data:
            return
        if self.journal.closed:
            self.log.write(data)
            return
        framer = self._framers[stream]
        region = framer.feed(data)
        if not region:
            self.log.write(data)
            return
        frames, lines = sse.encode_region_counted(stream, region, frames=True)
        self.log.write(data, lines if framer.verbatim else None)
        self.journal.append_frames(frames)

    def finish(
        self, exit_code: int, *, error: str | None = None, ename: str = "CommandExecError"
    ) -> None:
        """End the execution: ``error`` (with ``exit_code`` as ``evalue`` and ``error``, default
        ``exit status N``, as traceback) when it failed, else ``execution_complete``."""
        if self.finished_at is not None:
            return
        for stream, framer in self._framers.items():
            tail = framer.flush()
            if tail and not self.journal.closed:
                self.journal.append_frames(sse.encode_region(stream, tail, frames=True))
        self.exit_code = exit_code
        self.finished_at = time.time()
        elapsed_ms = int((time.monotonic() - self._t0) * 1000)
        if exit_code != 0 or error:
            self.error = error or f"exit status {exit_code}"
            self.journal.append(sse.error_event(ename, str(exit_code), [self.error]))
        else:
            self.journal.append(sse.complete_event(elapsed_ms))
        self.journal.close()
        if not self.done.done():
            self.done.set_result(None)

    def status(self) -> dict[str, Any]:
        """``CommandStatusResponse``; unset fields are left out, as the reference leaves them."""
        status = {
            "id": self.id,
            "content": self.content,
            "running": self.running,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": rfc3339(self.started_at),
            "finished_at": rfc3339(self.finished_at),
        }
        return {k: v for k, v in status.items() if v is not None and v != ""}

    def discard(self) -> None:
        self.journal.discard()
        self.log.discard()
