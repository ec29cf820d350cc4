"""One execution (a command or a session run): its output, events, status and end.

Output bytes go to an ``OutputLog`` (for ``/command/{id}/logs``) and, decoded as UTF-8
with an incremental decoder (invalid bytes become U+FFFD, split characters are kept
whole), to stdout/stderr events in an ``EventJournal``. ``finish`` appends the final
events: ``error`` (``CommandExecError`` with the exit code as ``evalue``, which the SDK
turns into ``exit_code``) when the code is non-zero, then ``execution_complete``.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import time
from datetime import UTC, datetime
from typing import Any

from sandlot.execd import sse
from sandlot.execd.journal import EventJournal, OutputLog
from sandlot.execd.sparefiles import SpareFiles


def rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


class Execution:
    def __init__(
        self, exec_id: str, content: str, state_dir: str, *, background: bool,
        files: SpareFiles | None = None,
    ) -> None:
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
        if files is not None:  # files made ahead (see sparefiles)
            journal_path, log_path = files.take(), files.take()
        else:
            journal_path = os.path.join(state_dir, f"{exec_id}.events")
            log_path = os.path.join(state_dir, f"{exec_id}.log")
        self.journal = EventJournal(journal_path)
        self.log = OutputLog(log_path)
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.journal.append(sse.init_event(exec_id))

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def feed(self, stream: str, data: bytes) -> None:
        """Record output of ``stream`` ("stdout" | "stderr")."""
        if not data:
            return
        self.log.write(data)
        if self.journal.closed:
            return
        text = self._decoders[stream].decode(data)
        if text:
            self.journal.append_json(sse.encode_output(stream, text))

    def finish(
        self, exit_code: int, *, error: str | None = None, ename: str = "CommandExecError"
    ) -> None:
        if self.finished_at is not None:
            return
        for stream, decoder in self._decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail and not self.journal.closed:
                self.journal.append(sse.make_event(stream, text=tail))
        self.exit_code = exit_code
        self.finished_at = time.time()
        elapsed_ms = int((time.monotonic() - self._t0) * 1000)
        if exit_code != 0 or error:
            self.error = error or f"exit status {exit_code}"
            self.journal.append(sse.error_event(ename, str(exit_code), [self.error]))
        self.journal.append(sse.complete_event(elapsed_ms, exit_code=exit_code))
        self.journal.close()
        if not self.done.done():
            self.done.set_result(None)

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content": self.content,
            "running": self.running,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": rfc3339(self.started_at),
            "finished_at": rfc3339(self.finished_at),
        }

    def discard(self) -> None:
        self.journal.discard()
        self.log.discard()
