"""Removing a sandbox's host directory while something may still touch it.

A delete can overlap a workload's last file activity (processes in uninterruptible sleep
finish their writes after SIGKILL; a lazily detached overlay settles): entries vanish or
appear under ``shutil.rmtree``, which then failed with ``FileNotFoundError``. The tree is
first renamed out of the way (one atomic step: whatever still works on the old path from then
on finds nothing), then removed with vanished entries ignored. A second delete finds nothing
to do. A crash in between leaves a ``.trash-*`` entry that ``sweep_trash`` removes later.

A delete answers once the rename is done: ``Remover`` removes the renamed tree afterwards,
on a thread of its own (removing a sandbox's directories was 7-20 ms of a ~50 ms delete on
the 2-core VM, mostly the file system's ``rmdir``), and the runtime's close waits for it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)
TRASH_PREFIX = ".trash-"
PASSES = 10


def _ignore_vanished(
    func: Any, path: str, exc_info: tuple[type[BaseException], BaseException, TracebackType]
) -> None:
    exc = exc_info[1]
    if isinstance(exc, FileNotFoundError):
        return  # removed by someone else meanwhile: fine
    if isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY:
        return  # refilled meanwhile: the next pass takes it
    raise exc


def _remove(path: Path) -> None:
    for _ in range(PASSES):
        if not os.path.lexists(path):
            return
        if os.path.islink(path) or not os.path.isdir(path):
            _unlink(path)
            continue
        shutil.rmtree(path, onerror=_ignore_vanished)
    if os.path.lexists(path):
        raise OSError(errno.ENOTEMPTY, f"{path} kept changing while it was being removed")


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def to_trash(path: Path) -> Path | None:
    """Rename ``path`` to a trash entry beside it (None when there is no ``path``)."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{secrets.token_hex(4)}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return None
    return trash


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it; idempotent (a missing path is fine)."""
    trash = to_trash(path)
    if trash is not None:
        _remove(trash)


class Remover:
    """Removes trashed trees one after another on a thread of its own, so that a burst of
    deletes neither waits for them nor fills the event loop's default executor, which
    creates and claims need meanwhile."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # made on first use, ended by close
        self._pending: set[Future[None]] = set()

    def remove_later(self, path: Path) -> None:
        """Rename ``path`` out of the way now; remove it soon. A tree that cannot be removed
        is logged and stays as trash (``sweep_trash`` tries again at the next start)."""
        trash = to_trash(path)
        if trash is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="sandlot-remove")
        future = self._pool.submit(_remove_logged, trash)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    async def wait(self) -> None:
        """Until every removal asked for so far has finished."""
        pending = list(self._pending)
        if pending:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))

    async def close(self) -> None:
        """Wait for the removals and end the thread (a later ``remove_later`` starts one)."""
        await self.wait()
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown)


def _remove_logged(trash: Path) -> None:
    try:
        _remove(trash)
    except OSError:
        log.warning("could not remove %s (removed at the next start)", trash, exc_info=True)


def sweep_trash(parent: Path) -> None:
    """Finish removals a crash interrupted."""
    if parent.is_dir():
        for entry in parent.iterdir():
            if entry.name.startswith(TRASH_PREFIX):
                _remove(entry)


def is_trash(name: str) -> bool:
    return name.startswith(TRASH_PREFIX)
