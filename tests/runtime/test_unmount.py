"""``mounts.unmount`` without mountinfo: stacked mounts all go, a non-mount point is a no-op."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from sandlot.runtime.oci import mounts
from tests.runtime.helpers import needs_root

_libc = ctypes.CDLL(None, use_errno=True)


def _tmpfs(target: Path) -> None:
    assert _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, b"size=1m") == 0, \
        os.strerror(ctypes.get_errno())


def test_stacked_mounts_all_go(tmp_path: Path) -> None:
    needs_root()
    target = tmp_path / "m"
    target.mkdir()
    _tmpfs(target)
    _tmpfs(target)
    assert mounts.is_mounted(target)
    mounts.unmount(target)
    assert not mounts.is_mounted(target)
    assert not os.path.ismount(target)


def test_busy_mount_is_detached(tmp_path: Path) -> None:
    needs_root()
    target = tmp_path / "m"
    target.mkdir()
    _tmpfs(target)
    held = os.open(target, os.O_RDONLY)  # keeps it busy: a plain umount fails with EBUSY
    try:
        mounts.unmount(target)
    finally:
        os.close(held)
    assert not mounts.is_mounted(target)


def test_not_a_mount_point_or_missing(tmp_path: Path) -> None:
    needs_root()
    mounts.unmount(tmp_path)  # a directory, not a mount point
    mounts.unmount(tmp_path / "missing")
