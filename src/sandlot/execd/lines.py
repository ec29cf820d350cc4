"""Line framing of command output, as the reference execd frames it: one stdout/stderr event
per line, terminator stripped.

Two readings, both the reference's (``components/execd/pkg/runtime``):

- commands (``command_common.go`` ``readFromPos``): ``\\n``, ``\\r`` and ``\\r\\n`` each end a
  line (``\\r\\n`` once, also when split between two reads); a blank line is sent as ``"\\n"``
  (see ``sse.encode_region``); an unterminated last line is flushed at the end.
- sessions (``bash_session.go``, a ``bufio.Scanner`` with ``ScanLines``): only ``\\n`` ends a
  line, one ``\\r`` before it is dropped, blank lines are not sent at all.

The framer hands out *regions*: the complete lines of a read, each ending in ``\\n`` (so a
blank line is an empty line), which ``sse.encode_region`` turns into events with a few byte
replaces rather than a Python step per line.

The reference holds a line of any length in memory; here a line reaching ``MAX_LINE`` bytes is
sent in ``MAX_LINE`` pieces (cut on a UTF-8 character boundary) so one endless line cannot
exhaust execd's memory.
"""

from __future__ import annotations

import re

MAX_LINE = 16 << 20
_TERMINATOR = re.compile(rb"\r\n|\r")


def _utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut <= ``limit`` that does not split a UTF-8 character (``limit`` if none)."""
    if limit >= len(data):  # nothing after the cut to split
        return limit
    cut = limit
    while cut > max(0, limit - 3) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 and (data[cut] & 0xC0) != 0x80 else limit


class LineFramer:
    """Splits one stream's bytes into complete lines; keeps the partial tail until more comes."""

    __slots__ = ("_after_cr", "_pending", "_session", "max_line", "verbatim")

    def __init__(self, *, session: bool = False, max_line: int = MAX_LINE) -> None:
        self._session = session
        self._pending = b""
        self._after_cr = False
        self.max_line = max_line
        # Whether the last ``feed``'s lines hold exactly the newlines of its data (no ``\r``
        # turned into one, no line dropped or cut): the caller can count them once for both.
        self.verbatim = True

    def feed(self, data: bytes) -> bytes:
        """The lines ``data`` completes, each ending in ``\\n`` (``b""`` when none)."""
        self.verbatim = True
        if self._session:
            return self._feed_session(data)
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":  # second half of a \r\n split between two reads
                data = data[1:]
                self.verbatim = False
        if b"\r" in data:  # (a held partial line never holds one)
            return self._feed_cr(data)
        last = data.rfind(b"\n")
        if last < 0:
            return self._hold(self._pending + data if self._pending else data)
        if last + 1 == len(data):  # the usual fast-stream read: whole lines, no copy
            region = self._pending + data if self._pending else data
            self._pending = b""
            return region
        # One copy of the lines (the held partial line and this read's complete lines).
        region = b"".join((self._pending, memoryview(data)[: last + 1]))
        self._pending = b""
        tail = data[last + 1:]
        if len(tail) >= self.max_line:
            return region + self._hold(tail)
        self._pending = tail
        return region

    def _feed_cr(self, data: bytes) -> bytes:
        self.verbatim = False
        if self._pending:
            data = self._pending + data
            self._pending = b""
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last < 0:
            return self._hold(data)
        region, tail = data[: last + 1], data[last + 1 :]
        if not tail and region[-1:] == b"\r":
            self._after_cr = True
        region = _TERMINATOR.sub(b"\n", region)
        return region + self._hold(tail) if tail else region

    def _feed_session(self, data: bytes) -> bytes:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        last = data.rfind(b"\n")
        if last < 0:
            return self._hold(data)
        region, tail = data[: last + 1], data[last + 1 :]
        if b"\r\n" in region or b"\n\n" in region or region[:1] == b"\n":
            self.verbatim = False
            lines = region[:-1].split(b"\n")
            kept = [line[:-1] if line[-1:] == b"\r" else line for line in lines]
            region = b"".join(line + b"\n" for line in kept if line)
        return region + self._hold(tail) if tail else region

    def _hold(self, partial: bytes) -> bytes:
        """Keep ``partial`` for later; pieces of it beyond ``max_line`` go out now."""
        out = b""
        while len(partial) >= self.max_line:
            self.verbatim = False
            cut = _utf8_cut(partial, self.max_line)
            out += partial[:cut] + b"\n"
            partial = partial[cut:]
        self._pending = partial
        return out

    def flush(self) -> bytes:
        """The unterminated last line, at the end of the output (``b""`` when none)."""
        rest, self._pending = self._pending, b""
        self._after_cr = False
        if self._session and rest.endswith(b"\r"):
            rest = rest[:-1]
        return rest + b"\n" if rest else b""


def split_region(region: bytes) -> list[bytes]:
    """The lines of a region (tests and slow paths)."""
    return region.split(b"\n")[:-1] if region else []
