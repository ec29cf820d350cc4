"""An append-only file whose oldest part is dropped past a cap, keeping offsets stable.

An execution's journals (its events, its raw output) are addressed by byte offset: SSE ids
and ``Last-Event-ID`` resume, ``/logs`` cursors. A command printing without end must not
grow them without bound (issue 11: "journals grow without cap"), yet offsets must keep
their meaning. So the data lives in segments of ``segment_bytes``: appends go to the last
one; when it is full a new one starts at the current logical size, and only the newest
``KEEP`` segments are kept, the oldest deleted. Offsets stay logical: ``floor`` is the
first one still stored, and readers asking for less get ``floor`` onwards (what a lagging
reader of a ring buffer gets). At most ``KEEP * segment_bytes`` (plus one append) is on
disk, as ``cappedlog`` bounds execd's own log.

Segments rotate only between appends, so an append (an event's whole line) never spans
two of them: a segment's start is an event boundary.

The dropped segment's file becomes the new segment (renamed, then overwritten from its
start) rather than being deleted while a new one is created: writing over pages the page
cache still holds costs a fraction of filling new ones (no page allocation, block
reservation or invalidation of the old file's pages; measured 0.08 against 0.3-2 ms of CPU
per MiB), and a long stream writes every byte twice (its output log and its events).
Readers never see the old contents: every read starts at or above ``floor``, checked in the
same event-loop step as the read, and a reader whose descriptor was the recycled file's
reopens it by its new path (its base offset changed).

With ``in_memory_up_to``, the data stays in memory until it outgrows that many bytes, and
only then goes to a file, whose path is asked for at that moment: most commands print a
few lines, and creating (then, on expiry, deleting) two files per command cost ext4 0.4 to
over 1 ms each (its inode allocator steps over every recently deleted inode, of which a
host that creates and removes sandboxes has many): profiled, a third of execd's CPU for a
``true`` (docs/benchmarks.md, 2026-12-04).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

KEEP = 2


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (a short write is possible on a full disk)."""
    view = memoryview(data)
    written = 0
    while written < len(data):
        n = os.pwrite(fd, view[written:], offset + written)
        if n <= 0:
            raise OSError("short write to journal")
        written += n


def _open_empty(path: str) -> int:
    """Open ``path`` for writing from its start, empty, created if missing.

    Not with ``O_TRUNC``, and no truncate of a file that is already empty (a spare file,
    sparefiles.py): on ext4, under a sandbox's overlay too, truncating a file to nothing
    marks it to have its data written out at close ("auto_da_alloc"), so every command's
    journal cost a flush to disk when it ended: close 15-56 us p50 and 0.6-4.8 ms p99
    against 1 us without, and disk writes for files deleted minutes later.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_size:
            os.ftruncate(fd, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


class SegmentedFile:
    def __init__(
        self, path: str | Callable[[], str], segment_bytes: int, *, in_memory_up_to: int = 0
    ) -> None:
        """``path``: the first segment's file, or what names it when it is needed (with
        ``in_memory_up_to``, only once the data outgrows memory)."""
        self._name_source = path if callable(path) else (lambda: path)
        self.path = ""  # the first segment's file; "" while the data is in memory
        self.segment_bytes = max(1, segment_bytes)
        self.size = 0
        self._fd = -1
        self._closed = False
        self._count = 1
        # Whether the segment being written is a recycled file, whose old bytes past ours
        # close() cuts off; a fresh one needs no truncate (see _open_empty for why not).
        self._recycled = False
        # The data while it is small (at most ``_memory_limit`` bytes, one segment's worth).
        self.memory: bytearray | None = None
        self._memory_limit = min(in_memory_up_to, self.segment_bytes)
        # (logical offset of its first byte, path), oldest first.
        self.segments: list[tuple[int, str]] = [(0, "")]
        if self._memory_limit > 0:
            self.memory = bytearray()
        else:
            self._open_first()

    def _open_first(self) -> None:
        path = self._name_source()
        self._fd = _open_empty(path)
        self.path = path
        self.segments = [(0, path)]

    def _spill(self) -> None:
        """Move the data from memory to the first segment's file (if the file cannot be
        made, the error is the append's and the data stays in memory)."""
        self._open_first()
        data, self.memory = self.memory, None
        if data:
            _write_all(self._fd, data, 0)

    @property
    def floor(self) -> int:
        """The first logical offset still stored."""
        return self.segments[0][0]

    @property
    def writable(self) -> bool:
        return not self._closed

    def append(self, *parts: bytes) -> int:
        """Write ``parts`` as one unit; returns the logical offset of its first byte."""
        if self._closed:
            raise RuntimeError("journal closed")
        if self.memory is not None:
            total = sum(len(p) for p in parts)
            if self.size + total <= self._memory_limit:
                offset = self.size
                for part in parts:
                    self.memory += part
                self.size += total
                return offset
            self._spill()
        base = self.segments[-1][0]
        if self.size - base >= self.segment_bytes:
            self._rotate()
            base = self.size
        offset = self.size
        total = sum(len(p) for p in parts)
        if os.pwritev(self._fd, parts, offset - base) != total:
            _write_all(self._fd, b"".join(parts), offset - base)  # short write: redo it whole
        self.size += total
        return offset

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        path = f"{self.path}.{self._count}"
        self._count += 1
        if len(self.segments) >= KEEP:
            _, old = self.segments.pop(0)
            try:
                os.rename(old, path)  # recycled: see the module's docstring
                self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                self._recycled = True
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(old)
        if self._fd < 0:
            self._fd = _open_empty(path)
            self._recycled = False
        self.segments.append((self.size, path))
        while len(self.segments) > KEEP:
            _, old = self.segments.pop(0)
            with contextlib.suppress(OSError):
                os.unlink(old)

    def close(self) -> None:
        """No more appends: free the write descriptor (reads open segments themselves). A
        recycled segment's old contents past the data are cut off."""
        self._closed = True
        if self._fd >= 0:
            if self._recycled:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size - self.segments[-1][0])
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        self.close()
        self.memory = None
        for _, path in self.segments:
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def reader(self) -> SegmentReader:
        return SegmentReader(self)


class SegmentReader:
    """Reads logical ranges; holds a descriptor of the segment it last read (close it)."""

    def __init__(self, file: SegmentedFile) -> None:
        self._file = file
        self._base = -1
        self._fd = -1

    def pread(self, n: int, pos: int) -> bytes:
        """Up to ``n`` bytes at logical ``pos`` (>= ``floor``), never across a segment end;
        b"" at the end of the data."""
        memory = self._file.memory
        if memory is not None:  # all of it, from offset 0
            return bytes(memory[pos:pos + n]) if pos < self._file.size else b""
        segments = self._file.segments  # at most KEEP: scanning them is cheap
        if pos < segments[0][0]:
            raise ValueError(f"offset {pos} was dropped (floor {segments[0][0]})")
        i = len(segments) - 1
        while segments[i][0] > pos:
            i -= 1
        base, path = segments[i]
        end = segments[i + 1][0] if i + 1 < len(segments) else None
        if end is None and pos >= self._file.size:
            return b""
        if self._fd < 0 or self._base != base:
            self.close()
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._base = base
        limit = n if end is None else min(n, end - pos)
        return os.pread(self._fd, limit, pos - base)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
