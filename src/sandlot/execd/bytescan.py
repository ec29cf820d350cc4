"""Byte scans of a command's output for the event encoder: SIMD search when available.

Every region of output lines that ``sse.encode_region_counted`` turns into events is asked
two questions: which control bytes other than the newline it holds (each needs a JSON
escape) and whether a line is blank (sent as ``"\\n"``). The standard library answers them
with a ``memchr`` per control byte (31 passes) and a ``re`` search: 0.68 of the encoder's
0.94 ms per MiB of short lines (this VM), paid from the sandbox's own CPU share, beside the
command it serves. StringZilla (a library of SIMD byte-string searches) answers both in
about 0.06 ms: one pass over the region for a set of bytes, one substring search. Without
its wheel (another platform), the standard library's scans are used; the events are the
same bytes either way.
"""

from __future__ import annotations

import re
from types import ModuleType

try:
    import stringzilla as _sz
except ImportError:  # no wheel for this platform: the standard library's scans
    _sz = None

# Control bytes JSON must escape, the line terminator aside (it ends an event instead).
CONTROLS = bytes(c for c in range(0x20) if c != 0x0A)
_BLANK_LINE = re.compile(b"\n\n")


def simd() -> ModuleType | None:
    """StringZilla, when it could be imported."""
    return _sz


def controls_in(region: bytes) -> tuple[int, ...]:
    """The control bytes (of ``CONTROLS``) that occur in ``region``, in ascending order."""
    if _sz is not None and _sz.find_first_of(region, CONTROLS) < 0:
        return ()  # the usual case: plain text
    return tuple(code for code in CONTROLS if code in region)  # a memchr each


def has_blank_line(region: bytes) -> bool:
    """Whether a line of ``region`` (whole lines, each ending in a newline) is empty."""
    if region[:1] == b"\n":
        return True
    if _sz is not None:
        return bool(_sz.find(region, b"\n\n") >= 0)
    return _BLANK_LINE.search(region) is not None
