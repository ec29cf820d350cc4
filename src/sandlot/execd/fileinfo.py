"""A file's metadata as the reference's execd writes it (``/files/info``, searches and
listings): type, size, times in RFC 3339 UTC with microseconds, owner and group names, and
the permission bits as octal digits written in decimal (``0o755`` -> ``755``)."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any


def mode_digits(st_mode: int) -> int:
    return int(oct(stat.S_IMODE(st_mode))[2:])


@lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@lru_cache(maxsize=256)
def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def iso_second(sec: int) -> str | None:
    """``YYYY-MM-DDTHH:MM:SS`` of a second; None outside years 1970..9999 (``iso`` then)."""
    if not 0 <= sec < 253402300800:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))


_SECONDS_KEPT = 4096
_seconds: dict[str, str] = {}  # a second's decimal digits -> iso_second of it


def iso_ns(ns: int) -> str:
    """``iso(ns / 1e9)`` (microseconds truncated), without a datetime per call: a listing
    formats two per entry, and the files of a directory share few distinct seconds. The
    second and the microseconds are cut from the decimal digits of ``ns`` (a divmod and a
    zero-padded format cost ~40 % more per call, 10,000 entries: docs/benchmarks.md)."""
    if ns < 0:
        return iso(ns / 1e9)
    digits = str(ns) if ns >= 1_000_000_000 else f"{ns:010d}"
    prefix = _seconds.get(digits[:-9])
    if prefix is None:
        formatted = iso_second(ns // 1_000_000_000)
        if formatted is None:
            return iso(ns / 1e9)
        if len(_seconds) >= _SECONDS_KEPT:
            _seconds.clear()
        prefix = _seconds[digits[:-9]] = formatted
    micros = digits[-9:-3]
    return f"{prefix}Z" if micros == "000000" else f"{prefix}.{micros}Z"


def entry_type(st_mode: int) -> str:
    if stat.S_ISLNK(st_mode):
        return "symlink"
    if stat.S_ISDIR(st_mode):
        return "directory"
    if stat.S_ISREG(st_mode):
        return "file"
    return "other"


def file_info(path: str, st: os.stat_result | None = None) -> dict[str, Any]:
    st = st or os.lstat(path)
    return {
        "path": path,
        "type": entry_type(st.st_mode),
        "size": st.st_size,
        "modified_at": iso_ns(st.st_mtime_ns),
        "created_at": iso_ns(st.st_ctime_ns),
        "owner": user_name(st.st_uid),
        "group": group_name(st.st_gid),
        "mode": mode_digits(st.st_mode),
    }
