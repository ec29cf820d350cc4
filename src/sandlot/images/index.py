"""The store's on-disk index (tags -> image ids -> metadata), shared by several processes.

Writers hold an exclusive ``flock`` on ``.lock`` while they read-modify-write ``index.json``
and replace it by an atomic rename, so the server and CLI can change the store at once.
Readers never lock: they see either the old or the new file, and reload only when its
identity (inode, size, mtime) changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX_VERSION = 1


@dataclass
class IndexData:
    """tags: canonical reference -> {"name": as tagged, "id": digest};
    images: digest -> {"config": {...}, "size_bytes": int, "created": str, "source": str}."""

    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": INDEX_VERSION, "tags": self.tags, "images": self.images}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> IndexData:
        return cls(tags=dict(raw.get("tags", {})), images=dict(raw.get("images", {})))


class ImageIndex:
    def __init__(self, root: Path):
        self.root = root
        self.path = root / "index.json"
        self.lock_path = root / ".lock"
        self._stamp: tuple[int, int, int] | None = None
        self._data = IndexData()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> IndexData:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return IndexData.from_json(json.load(fh))
        except FileNotFoundError:
            return IndexData()

    def current(self) -> IndexData:
        """The index as on disk now (cheap when unchanged: one stat)."""
        stamp = self._file_stamp()
        if stamp != self._stamp:
            self._data = self._read() if stamp is not None else IndexData()
            self._stamp = stamp
        return self._data

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive store lock (across processes) without touching the index."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def edit(self) -> Iterator[IndexData]:
        """Lock, yield a fresh copy of the index to change, then write it atomically."""
        with self.lock():
            data = self._read()
            yield data
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".index.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data.to_json(), fh, indent=1, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
