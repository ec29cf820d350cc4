"""Empty files made ahead of need for the journals of commands.

A command whose output outgrows memory (execution.py ``IN_MEMORY_BYTES``) keeps two files
(its event journal and its output log) so that a dropped stream can be resumed and logs
read from a cursor; they are taken from here when its journals move to disk. Creating a
file is a metadata operation of the filesystem under the sandbox's /tmp: 0.4 to over 1 ms
each on the ext4 of the dev VM, while opening an existing empty file costs ~0.01 ms. So the
files are made after a command's stream has been sent (``top_up``), while the client reads
the result, instead of on the request path. (A thread doing it instead ping-pongs the GIL
with the event loop: measured slower.)
"""

from __future__ import annotations

import itertools
import os
from collections import deque

KEEP = 4  # two commands' worth; a burst beyond that creates its own files


class SpareFiles:
    """Hands out paths of existing empty files in ``directory`` (``take``)."""

    def __init__(self, directory: str, keep: int = KEEP) -> None:
        self.directory = directory
        self.keep = keep
        self._ready: deque[str] = deque()
        self._names = itertools.count()
        self._closed = False

    def take(self) -> str:
        """The path of an empty file made ahead, or a fresh name the caller creates."""
        if self._ready:
            return self._ready.popleft()
        return self._new_name()

    def top_up(self) -> None:
        """Make files until ``keep`` are ready (call when no request is waiting on it)."""
        while not self._closed and len(self._ready) < self.keep:
            path = self._new_name()
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except OSError:
                return  # e.g. the state dir is gone (shutting down): take() copes
            os.close(fd)
            self._ready.append(path)

    def close(self) -> None:
        """Make no more files and remove the ones not handed out."""
        self._closed = True
        while self._ready:
            try:
                os.unlink(self._ready.popleft())
            except OSError:
                pass

    def _new_name(self) -> str:
        return os.path.join(self.directory, f"j{next(self._names)}")
