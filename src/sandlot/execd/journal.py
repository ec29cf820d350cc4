"""On-disk journals of an execution: its SSE events and its raw output log.

Both live in files so a command printing gigabytes costs disk, not execd memory, and so a
client that lost its stream can resume: an event's SSE id is the byte offset of its line in
the journal, so ``Last-Event-ID: N`` means "continue after the line at offset N".

The events journal holds them in the reference's wire framing (each event's one-line JSON
and a blank line), so a follower in that framing (the default, what the SDKs get) sends
what it reads as it is, and a follower that has caught up takes a new append's bytes
straight from memory (the object just written) instead of reading the file back: on a fast
stream of short lines each copy of the event text costs as much as the framing itself.

``OutputLog`` keeps stdout+stderr bytes as produced and a sparse index of line starts (an
entry at most every ``INDEX_EVERY`` lines, at a line start within a write) so
``/command/{id}/logs?cursor=L`` seeks without holding every line offset in memory.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncIterator, Callable
from typing import Any

from sandlot.execd import sse
from sandlot.execd.segments import SegmentedFile, SegmentReader

# A follower reads at most this much per step; a fast stream's step is then one HTTP chunk
# of a few hundred events rather than many small ones (each a send and a wake-up).
READ_BLOCK = 1 << 20
INDEX_EVERY = 1024
# Each journal of an execution (events, raw output) keeps at most about this much on disk:
# past it the oldest output is dropped (see segments.py).
DEFAULT_MAX_BYTES = 64 << 20


class _Signal:
    """Wakes every current waiter; cheaper than a Condition for one producer."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[bool]] = []

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(True)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait for the next ``fire``; False when ``timeout`` seconds passed first."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        timer = None if timeout is None else loop.call_later(timeout, _time_out, fut)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)


def _time_out(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class EventJournal:
    """Append-only file of one-line JSON events; readers follow it until it is closed."""

    def __init__(
        self, path: str | Callable[[], str], max_bytes: int = DEFAULT_MAX_BYTES, *,
        in_memory_up_to: int = 0,
    ) -> None:
        """``path`` and ``in_memory_up_to``: see ``SegmentedFile``."""
        self._file = SegmentedFile(path, max_bytes // 2, in_memory_up_to=in_memory_up_to)
        self.closed = False
        self.discarded = False
        self._signal = _Signal()
        # Backpressure (see ``backlog``): what each live follower has consumed, and who waits
        # for the slowest of them to catch up.
        self.backpressure_bytes = max_bytes // 4
        self._followers: dict[int, int] = {}
        self._drained_callbacks: list[Callable[[], None]] = []
        # The latest append (offset, bytes), kept while followers are connected: one waiting
        # at that offset takes it from here rather than reading it back from the file. Not
        # kept past its only follower's taking it, nor once the journal closes (a quiet or
        # retained execution must not pin its last block).
        self._last: tuple[int, bytes] | None = None

    @property
    def size(self) -> int:
        return self._file.size

    @property
    def floor(self) -> int:
        """The first offset still stored (older events were dropped past the cap)."""
        return self._file.floor

    def append(self, event: dict[str, Any]) -> int:
        """Write one event; returns its id (the offset of its line)."""
        return self.append_frames(sse.encode_data(event).encode() + sse.FRAME_END)

    def append_frames(self, data: bytes) -> int:
        """Write events given in the reference's framing (each one-line JSON followed by a
        blank line, see ``sse.encode_region(frames=True)``); returns the first one's id."""
        if self.closed:
            raise RuntimeError("journal closed")
        offset = self._file.append(data)
        self._last = (offset, data) if self._followers else None
        self._signal.fire()
        return offset

    def backlog(self) -> int:
        """Bytes written that the slowest connected follower has not consumed yet (0 with
        none). Past ``backpressure_bytes`` the producer stops reading the command's pipes
        until followers catch up, so a slow client slows the command instead of losing the
        oldest output to the cap (the reference keeps uncapped output files instead)."""
        if not self._followers:
            return 0
        return self.size - min(self._followers.values())

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the backlog is at most half ``backpressure_bytes``, the
        last follower has gone, or the journal is discarded."""
        self._drained_callbacks.append(callback)
        self._check_drained()

    def _check_drained(self) -> None:
        if not self._drained_callbacks:
            return
        if self.discarded or self.backlog() <= self.backpressure_bytes // 2:
            callbacks, self._drained_callbacks = self._drained_callbacks, []
            for callback in callbacks:
                callback()

    def close(self) -> None:
        """No more events: followers drain what is left and stop. Frees the write descriptor
        (many finished executions are retained; each must not pin a descriptor)."""
        if not self.closed:
            self.closed = True
            self._last = None
            self._file.close()
            self._signal.fire()

    def discard(self) -> None:
        self.close()
        self.discarded = True
        self._file.remove()
        self._signal.fire()
        self._check_drained()

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
        if seen < self.floor:  # dropped past the cap: continue with the oldest kept event
            return self.floor
        # Skip the seen line itself and the blank line after it.
        pos = seen
        with self._file.reader() as reader:
            while pos < self.size:
                block = reader.pread(min(READ_BLOCK, self.size - pos), pos)
                if not block:
                    break
                nl = block.find(b"\n")
                if nl >= 0:
                    after = pos + nl + 1
                    if after < self.size and reader.pread(1, after) == b"\n":
                        after += 1
                    return after
                pos += len(block)
        return self.size

    async def follow(
        self, start: int = 0, keepalive: float | None = None, *, sse_frames: bool = False
    ) -> AsyncIterator[bytes]:
        """Frames from ``start`` on, waiting for new events until the journal closes; with
        ``keepalive``, a keep-alive after every ``keepalive`` seconds without events.
        ``sse_frames``: standard SSE (``id:`` = the event's offset, ``data:``, comment
        keep-alives), else the reference's framing (the JSON and a blank line, ``ping``
        events).

        Keep-alives come from here rather than from ``sse.with_keepalive`` (a task per frame,
        most of the event plumbing of a short command)."""
        reader = self._file.reader()
        pos = start
        pending = b""
        key = id(reader)
        self._followers[key] = start
        try:
            while not self.discarded:
                # Everything before ``pos`` minus the partial line has been taken by the
                # consumer by the time this generator runs again.
                self._followers[key] = pos - len(pending)
                self._check_drained()
                if pos < self.floor:  # this reader fell behind past the cap: skip ahead
                    pos, pending = self.floor, b""
                if pos < self.size:
                    last = self._last
                    if last is not None and last[0] == pos and not pending:
                        block = last[1]  # just appended: no need to read it back
                        if len(self._followers) == 1:
                            self._last = None  # nobody else can want it
                    else:
                        try:
                            block = reader.pread(min(READ_BLOCK, self.size - pos), pos)
                        except OSError:
                            return
                    if not block:
                        return
                    data = pending + block if pending else block
                    line_start = pos - len(pending)
                    pos += len(block)
                    if not sse_frames:  # the journal's own framing: sent as it is
                        if data.endswith(sse.FRAME_END):  # the usual case: whole appends
                            pending = b""
                            yield data
                            continue
                        end = data.rfind(sse.FRAME_END)
                        if end < 0:
                            pending = data
                            continue
                        pending = data[end + 2:]
                        yield data[: end + 2]
                        continue
                    frames: list[bytes] = []
                    cursor = 0
                    while True:
                        nl = data.find(b"\n", cursor)  # an event's JSON holds no newline
                        if nl < 0 or nl + 1 >= len(data):  # its blank line not read yet
                            break
                        frames.append(
                            b"id: %d\ndata: %b\n\n" % (line_start + cursor, data[cursor:nl])
                        )
                        cursor = nl + 2
                    pending = data[cursor:]
                    if frames:
                        yield b"".join(frames)
                    continue
                if self.closed:
                    return
                if not await self._signal.wait(keepalive):
                    yield sse.keepalive_frame(sse_frames)
        finally:
            reader.close()
            del self._followers[key]
            self._check_drained()


class OutputLog:
    """Raw combined output with a sparse line index for cursor reads.

    Past ``max_bytes`` the oldest output is dropped (segments.py); line numbers stay
    absolute, and a cursor below the oldest kept line reads from the oldest kept byte.
    """

    def __init__(
        self, path: str | Callable[[], str], max_bytes: int = DEFAULT_MAX_BYTES, *,
        in_memory_up_to: int = 0,
    ) -> None:
        """``path`` and ``in_memory_up_to``: see ``SegmentedFile``."""
        self._file = SegmentedFile(path, max_bytes // 2, in_memory_up_to=in_memory_up_to)
        self.lines = 0  # complete lines so far
        # Sparse index: line numbers (ascending, >= INDEX_EVERY apart) and their byte offsets.
        self._index_lines: list[int] = [0]
        self._index_offsets: list[int] = [0]
        # Complete lines before each segment's first byte (its first line may be a tail).
        self._lines_before: dict[int, int] = {0: 0}

    @property
    def size(self) -> int:
        return self._file.size

    @property
    def floor(self) -> int:
        """The first offset still stored (older output was dropped past the cap)."""
        return self._file.floor

    def seal(self) -> None:
        """The execution ended: free the write descriptor (reads reopen the file)."""
        self._file.close()

    def write(self, data: bytes, newlines: int | None = None) -> None:
        """Append ``data``; ``newlines``: its count of ``\\n`` when the caller knows it already
        (the encoder's, see ``Execution.feed``): a count pass costs as much as the framing."""
        if not self._file.writable:
            return
        offset = self._file.append(data)
        if offset == self._file.segments[-1][0] and offset not in self._lines_before:
            # A new segment's start: keep its line count, forget dropped segments'.
            floor = self._file.floor
            self._lines_before = {o: n for o, n in self._lines_before.items() if o >= floor}
            self._lines_before[offset] = self.lines
        # O(1) Python work per write whatever the line count (a loop per line cost a quarter
        # of a streaming command's CPU): count in C, index at most one line start per write.
        count = data.count(b"\n") if newlines is None else newlines
        if count:
            if self.lines + 1 - self._index_lines[-1] >= INDEX_EVERY:
                self._index_lines.append(self.lines + 1)
                self._index_offsets.append(offset + data.index(b"\n") + 1)
            self.lines += count

    def _offset_of_line(self, line: int) -> int:
        floor = self._file.floor
        floor_line = self._lines_before.get(floor, 0)
        slot = bisect.bisect_right(self._index_lines, line) - 1
        pos, base_line = self._index_offsets[slot], self._index_lines[slot]
        if pos < floor:  # that part was dropped: count from the oldest kept byte
            if line <= floor_line:
                return floor
            pos, base_line = floor, floor_line
        remaining = line - base_line
        if remaining <= 0:
            return min(pos, self.size)
        with self._file.reader() as reader:
            return self._scan(reader, pos, remaining)

    def _scan(self, reader: SegmentReader, pos: int, remaining: int) -> int:
        """The offset after the ``remaining``-th newline from ``pos`` (or the end)."""
        while remaining > 0 and pos < self.size:
            block = reader.pread(min(READ_BLOCK, self.size - pos), pos)
            if not block:
                break
            count = block.count(b"\n")
            if count < remaining:
                remaining -= count
                pos += len(block)
                continue
            # The ``remaining``-th newline is in this block: what follows it is the last piece.
            tail = block.split(b"\n", remaining)[-1]
            return min(pos + len(block) - len(tail), self.size)
        return min(pos, self.size)

    def read_from_line(self, cursor: int | None, *, finished: bool) -> tuple[int, int, int]:
        """(start, end, next_cursor) byte range for lines ``cursor..``.

        With a cursor only complete lines are returned while the command runs, so polling
        never returns half a line twice; without one (or once finished) everything is.
        """
        total = self.lines + (1 if finished and self.size and not self._ends_with_newline() else 0)
        if cursor is None:
            return self._file.floor, self.size, total
        cursor = max(0, cursor)
        if cursor >= total:
            return self.size, self.size, total
        start = self._offset_of_line(cursor)
        end = self.size if finished else self._offset_of_line(self.lines)
        return start, end, total

    def _ends_with_newline(self) -> bool:
        if not self.size:
            return True
        with self._file.reader() as reader:
            return reader.pread(1, self.size - 1) == b"\n"

    async def iter_range(self, start: int, end: int) -> AsyncIterator[bytes]:
        reader = self._file.reader()
        try:
            pos = max(start, self._file.floor)
            while pos < end:
                pos = max(pos, self._file.floor)  # dropped while this was read: skip ahead
                try:
                    block = reader.pread(min(READ_BLOCK, end - pos), pos)
                except OSError:
                    return
                if not block:
                    return
                pos += len(block)
                yield block
        finally:
            reader.close()

    def discard(self) -> None:
        self._file.remove()
