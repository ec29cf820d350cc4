"""Progress reports from long image operations (pulls, imports, builds).

Callbacks may be invoked from a worker thread (unpacking runs off the event loop), so a
callback must be thread-safe; rich's Progress is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    phase: str  # "resolve", "download", "unpack", "build", "commit", "done"
    current: int = 0
    total: int | None = None  # None when the amount of work is unknown
    message: str = ""


ProgressFn = Callable[[Progress], None]


def emitter(progress: ProgressFn | None) -> ProgressFn:
    """A callback that is safe to call when the caller gave none."""

    def emit(event: Progress) -> None:
        if progress is not None:
            progress(event)

    return emit
