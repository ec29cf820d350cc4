"""The tail of a log file: the last bytes of it, and whether anything before them was cut."""

from __future__ import annotations

import os
from pathlib import Path


def tail_file(path: Path, max_bytes: int) -> tuple[bytes, bool] | None:
    """Last ``max_bytes`` of ``path`` (from a line start when cut); None when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    return cut_to_line(data, start > 0), start > 0


def cut_to_line(data: bytes, cut: bool) -> bytes:
    """Drop the partial first line of a cut tail."""
    if cut and b"\n" in data:
        return data.partition(b"\n")[2]
    return data
