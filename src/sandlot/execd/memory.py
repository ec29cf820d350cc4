"""glibc malloc tuning for execd's megabyte buffers, and giving the memory back when idle.

A fast stream or a file transfer allocates and frees several 1 MiB objects per megabyte
(pipe read, decoded text, JSON line, SSE frame, ...). With glibc's defaults each of them
comes from a fresh ``mmap`` or a heap that was just trimmed, so every page is faulted in and
zeroed again: profiled, that kernel work was half of execd's CPU on a stream. ``tune()`` keeps
such buffers in the heap (mmap threshold 8 MiB) and stops trimming the heap top after every
free (trim threshold 32 MiB); ``trim_soon()``, called after such work, returns the free
memory to the kernel once execd has been quiet for a moment, so the idle RSS stays small.

Without glibc (musl, or no ``mallopt``) both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 32 << 20
TRIM_DELAY = 2.0

_libc: ctypes.CDLL | None = None
_tuned = False
_trim_handle: asyncio.TimerHandle | None = None


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None)  # the running libc; find_library would spawn ldconfig
            lib.mallopt  # noqa: B018 - glibc only
            lib.malloc_trim  # noqa: B018
        except (OSError, AttributeError):
            return None
        _libc = lib
    return _libc


def tune() -> bool:
    """Keep megabyte buffers in the heap (once per process); False without glibc."""
    global _tuned
    if _tuned:
        return True
    lib = _load()
    if lib is None:
        return False
    ok = bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    _tuned = ok
    return ok


def trim() -> None:
    """Give free heap memory back to the kernel now."""
    lib = _load()
    if lib is not None:
        lib.malloc_trim(0)


def trim_soon(delay: float = TRIM_DELAY) -> None:
    """``trim()`` after ``delay`` s; calls meanwhile push it back (one trim after a burst)."""
    global _trim_handle
    if not _tuned:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if _trim_handle is not None:
        _trim_handle.cancel()
    _trim_handle = loop.call_later(delay, _run_trim)


def _run_trim() -> None:
    global _trim_handle
    _trim_handle = None
    trim()
