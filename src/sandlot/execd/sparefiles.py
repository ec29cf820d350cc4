"""Empty files made ahead of need for the journals of commands.

Every command keeps two files (its event journal and its output log) so that a dropped
stream can be resumed and logs read from a cursor. Creating a file is a metadata operation of
the filesystem under the sandbox's /tmp: ~0.4 ms each on the ext4 of the dev VM, i.e. most of
execd's own share of a ``true`` round trip. Opening an existing empty file costs ~0.01 ms. So
a few files are created ahead, on a thread (the syscalls release the GIL and run on another
core), while commands come and go; a command takes one or makes its own when none is left.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque

KEEP = 8  # files ready (four commands' worth); a burst beyond that creates its own


class SpareFiles:
    """Hands out paths of existing empty files in ``directory`` (``take``)."""

    def __init__(self, directory: str, keep: int = KEEP) -> None:
        self.directory = directory
        self.keep = keep
        self._ready: deque[str] = deque()
        self._names = itertools.count()
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def take(self) -> str:
        """The path of an empty file (made ahead), or of a new name the caller creates."""
        try:
            path = self._ready.popleft()
        except IndexError:
            path = self._new_name()
        self._top_up()
        return path

    def close(self) -> None:
        """Stop making files and remove the ones not handed out."""
        self._stopped = True
        self._wanted.set()
        while self._ready:
            try:
                os.unlink(self._ready.popleft())
            except (IndexError, OSError):
                pass

    def _new_name(self) -> str:
        return os.path.join(self.directory, f"j{next(self._names)}")

    def _top_up(self) -> None:
        if self._stopped or self.keep <= 0:
            return
        if self._thread is None:  # started on first use: an idle execd has no extra thread
            self._thread = threading.Thread(target=self._fill, name="execd-spare-files",
                                            daemon=True)
            self._thread.start()
        self._wanted.set()

    def _fill(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            while not self._stopped and len(self._ready) < self.keep:
                path = self._new_name()
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                except OSError:
                    break  # e.g. the state dir is gone (shutting down): take() copes
                os.close(fd)
                if self._stopped:
                    os.unlink(path)
                    return
                self._ready.append(path)
            if self._stopped:
                return
