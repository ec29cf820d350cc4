"""Line framing of command output, as the reference execd frames it: one stdout/stderr event
per line, terminator stripped.

Two readings, both the reference's (``components/execd/pkg/runtime``):

- commands (``command_common.go`` ``readFromPos``): ``\\n``, ``\\r`` and ``\\r\\n`` each end a
  line (``\\r\\n`` once, also when split between two reads); a blank line is sent as ``"\\n"``
  (here ``b""``, see ``sse.encode_lines``); an unterminated last line is flushed at the end.
- sessions (``bash_session.go``, a ``bufio.Scanner`` with ``ScanLines``): only ``\\n`` ends a
  line, one ``\\r`` before it is dropped, blank lines are not sent at all.

The reference holds a line of any length in memory; here a line reaching ``MAX_LINE`` bytes is
sent in ``MAX_LINE`` pieces (cut on a UTF-8 character boundary) so one endless line cannot
exhaust execd's memory.
"""

from __future__ import annotations

import re

MAX_LINE = 16 << 20
_TERMINATOR = re.compile(rb"\r\n|\r|\n")


def _utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut <= ``limit`` that does not split a UTF-8 character (``limit`` if none)."""
    cut = limit
    while cut > max(0, limit - 3) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 and (data[cut] & 0xC0) != 0x80 else limit


class LineFramer:
    """Splits one stream's bytes into complete lines; keeps the partial tail until more comes."""

    __slots__ = ("_after_cr", "_pending", "_session", "max_line")

    def __init__(self, *, session: bool = False, max_line: int = MAX_LINE) -> None:
        self._session = session
        self._pending = b""
        self._after_cr = False
        self.max_line = max_line

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes (blank lines as ``b""`` in command mode)."""
        if self._session:
            return self._feed_session(data)
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":  # second half of a \r\n split between two reads
                data = data[1:]
        if self._pending:
            data = self._pending + data
            self._pending = b""
        has_cr = b"\r" in data
        last = max(data.rfind(b"\n"), data.rfind(b"\r")) if has_cr else data.rfind(b"\n")
        if last < 0:
            return self._hold(data)
        head, tail = data[: last + 1], data[last + 1 :]
        if not tail and head[-1:] == b"\r":
            self._after_cr = True
        lines = _TERMINATOR.split(head) if has_cr else head.split(b"\n")
        lines.pop()  # the empty text after the last terminator
        if tail:
            lines.extend(self._hold(tail))
        return lines

    def _feed_session(self, data: bytes) -> list[bytes]:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        last = data.rfind(b"\n")
        if last < 0:
            return self._hold(data)
        lines = data[:last].split(b"\n")
        if b"\r" in data:
            lines = [line[:-1] if line[-1:] == b"\r" else line for line in lines]
        lines = [line for line in lines if line]
        tail = data[last + 1 :]
        if tail:
            lines.extend(self._hold(tail))
        return lines

    def _hold(self, partial: bytes) -> list[bytes]:
        """Keep ``partial`` for later; pieces of it beyond ``max_line`` go out now."""
        out: list[bytes] = []
        while len(partial) >= self.max_line:
            cut = _utf8_cut(partial, self.max_line)
            out.append(partial[:cut])
            partial = partial[cut:]
        self._pending = partial
        return out

    def flush(self) -> list[bytes]:
        """The unterminated last line, at the end of the output (none when there is none)."""
        rest, self._pending = self._pending, b""
        self._after_cr = False
        if self._session and rest.endswith(b"\r"):
            rest = rest[:-1]
        return [rest] if rest else []
