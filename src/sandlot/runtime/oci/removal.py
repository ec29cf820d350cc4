"""Removing a sandbox's host directory while something may still touch it.

A delete can overlap a workload's last file activity (processes in uninterruptible sleep
finish their writes after SIGKILL; a lazily detached overlay settles): entries vanish or
appear under ``shutil.rmtree``, which then failed with ``FileNotFoundError``. The tree is
first renamed out of the way (one atomic step: whatever still works on the old path from then
on finds nothing), then removed with vanished entries ignored. A second delete finds nothing
to do. A crash in between leaves a ``.trash-*`` entry that ``sweep_trash`` removes later.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

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


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it; idempotent (a missing path is fine)."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{secrets.token_hex(4)}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    _remove(trash)


def sweep_trash(parent: Path) -> None:
    """Finish removals a crash interrupted."""
    if parent.is_dir():
        for entry in parent.iterdir():
            if entry.name.startswith(TRASH_PREFIX):
                _remove(entry)


def is_trash(name: str) -> bool:
    return name.startswith(TRASH_PREFIX)
