"""On-disk journals of an execution: its SSE events and its raw output log.

Both live in files so a command printing gigabytes costs disk, not execd memory, and so a
client that lost its stream can resume: an event's SSE id is the byte offset of its line in
the journal, so ``Last-Event-ID: N`` means "continue after the line at offset N".

``OutputLog`` keeps stdout+stderr bytes as produced and a sparse index of line starts
(one entry per ``INDEX_EVERY`` lines) so ``/command/{id}/logs?cursor=L`` seeks without
holding every line offset in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from sandlot.execd import sse

READ_BLOCK = 256 * 1024
INDEX_EVERY = 1024


class _Signal:
    """Wakes every current waiter; cheaper than a Condition for one producer."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)


class EventJournal:
    """Append-only file of one-line JSON events; readers follow it until it is closed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.size = 0
        self.closed = False
        self.discarded = False
        self._signal = _Signal()

    def append(self, event: dict[str, Any]) -> int:
        """Write one event; returns its id (the offset of its line)."""
        if self.closed:
            raise RuntimeError("journal closed")
        line = (sse.encode_data(event) + "\n").encode()
        offset = self.size
        os.pwrite(self._fd, line, offset)
        self.size += len(line)
        self._signal.fire()
        return offset

    def close(self) -> None:
        """No more events: followers drain what is left and stop. Frees the write descriptor
        (many finished executions are retained; each must not pin a descriptor)."""
        if not self.closed:
            self.closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._signal.fire()

    def discard(self) -> None:
        self.close()
        self.discarded = True
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._signal.fire()

    def _open_reader(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def resume_offset(self, last_event_id: str | None) -> int:
        """Where a reader that has seen ``last_event_id`` continues (0 for a new reader)."""
        if last_event_id is None:
            return 0
        try:
            seen = int(last_event_id)
        except ValueError:
            return 0
        if seen < 0 or seen >= self.size:
            return self.size if seen >= self.size else 0
        # Skip the seen line itself.
        pos = seen
        fd = self._open_reader()
        try:
            while pos < self.size:
                block = os.pread(fd, min(READ_BLOCK, self.size - pos), pos)
                if not block:
                    break
                nl = block.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                pos += len(block)
        finally:
            os.close(fd)
        return self.size

    async def follow(self, start: int = 0) -> AsyncIterator[bytes]:
        """SSE frames from ``start`` on, waiting for new events until the journal closes."""
        try:
            fd = self._open_reader()
        except OSError:
            return
        pos = start
        pending = b""
        try:
            while not self.discarded:
                if pos < self.size:
                    block = os.pread(fd, min(READ_BLOCK, self.size - pos), pos)
                    if not block:
                        return
                    data = pending + block
                    line_start = pos - len(pending)
                    pos += len(block)
                    frames: list[bytes] = []
                    cursor = 0
                    while True:
                        nl = data.find(b"\n", cursor)
                        if nl < 0:
                            break
                        frames.append(
                            b"id: %d\ndata: %b\n\n" % (line_start + cursor, data[cursor:nl])
                        )
                        cursor = nl + 1
                    pending = data[cursor:]
                    if frames:
                        yield b"".join(frames)
                    continue
                if self.closed:
                    return
                await self._signal.wait()
        finally:
            os.close(fd)


class OutputLog:
    """Raw combined output with a sparse line index for cursor reads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.size = 0
        self.lines = 0  # complete lines so far
        self._index: list[int] = [0]  # byte offset of line k*INDEX_EVERY

    def seal(self) -> None:
        """The execution ended: free the write descriptor (reads reopen the file)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _reader(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def write(self, data: bytes) -> None:
        if self._fd < 0:
            return
        os.pwrite(self._fd, data, self.size)
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self.lines += 1
            if self.lines % INDEX_EVERY == 0:
                self._index.append(self.size + nl + 1)
            start = nl + 1
        self.size += len(data)

    def _offset_of_line(self, line: int) -> int:
        slot = min(line // INDEX_EVERY, len(self._index) - 1)
        pos = self._index[slot]
        remaining = line - slot * INDEX_EVERY
        if remaining <= 0:
            return min(pos, self.size)
        fd = self._reader()
        try:
            return self._scan(fd, pos, remaining)
        finally:
            os.close(fd)

    def _scan(self, fd: int, pos: int, remaining: int) -> int:
        while remaining > 0 and pos < self.size:
            block = os.pread(fd, min(READ_BLOCK, self.size - pos), pos)
            if not block:
                break
            start = 0
            while remaining > 0:
                nl = block.find(b"\n", start)
                if nl < 0:
                    break
                remaining -= 1
                start = nl + 1
            pos += start if remaining == 0 else len(block)
        return min(pos, self.size)

    def read_from_line(self, cursor: int | None, *, finished: bool) -> tuple[int, int, int]:
        """(start, end, next_cursor) byte range for lines ``cursor..``.

        With a cursor only complete lines are returned while the command runs, so polling
        never returns half a line twice; without one (or once finished) everything is.
        """
        total = self.lines + (1 if finished and self.size and not self._ends_with_newline() else 0)
        if cursor is None:
            return 0, self.size, total
        cursor = max(0, cursor)
        if cursor >= total:
            return self.size, self.size, total
        start = self._offset_of_line(cursor)
        end = self.size if finished else self._offset_of_line(self.lines)
        return start, end, total

    def _ends_with_newline(self) -> bool:
        if not self.size:
            return True
        fd = self._reader()
        try:
            return os.pread(fd, 1, self.size - 1) == b"\n"
        finally:
            os.close(fd)

    async def iter_range(self, start: int, end: int) -> AsyncIterator[bytes]:
        if start >= end:
            return
        try:
            fd = self._reader()
        except OSError:
            return
        try:
            pos = start
            while pos < end:
                block = os.pread(fd, min(READ_BLOCK, end - pos), pos)
                if not block:
                    return
                pos += len(block)
                yield block
        finally:
            os.close(fd)

    def discard(self) -> None:
        self.seal()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
