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


_INFO = (
    b"22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    b"47 22 254:0 /images/x /data/sandboxes/a/lower/0 ro,idmapped - ext4 /dev/vda rw\n"
    b"50 22 0:40 / /run/rootfs/a/rootfs rw - overlay overlay "
    b"rw,lowerdir=/data/sandboxes/a/lower/0,upperdir=/data/sandboxes/a/rw/upper\n"
    b"51 22 0:41 / /data/sandboxes/ab rw - tmpfs tmpfs rw\n"
    b"52 22 0:42 / /data/sandboxes/a\\040b/v rw - tmpfs tmpfs rw"
)


def test_mount_points_come_from_the_mount_point_field_only() -> None:
    # the overlay's options name /data/sandboxes/a too; its mount point is elsewhere
    assert mounts._mount_points(_INFO, ["/data/sandboxes/a"]) == ["/data/sandboxes/a/lower/0"]
    # a sibling whose name starts the same is not below the prefix
    assert mounts._mount_points(_INFO, ["/data/sandboxes/ab"]) == ["/data/sandboxes/ab"]
    assert mounts._mount_points(_INFO, ["/data/sandboxes/a", "/run/rootfs/a"]) == [
        "/data/sandboxes/a/lower/0", "/run/rootfs/a/rootfs"]
    assert mounts._mount_points(_INFO, ["/nowhere"]) == []


def test_escaped_paths_match_and_come_back_unescaped() -> None:
    # mountinfo writes the space as \040 (the last line also has no newline)
    assert mounts._mount_points(_INFO, ["/data/sandboxes/a b"]) == ["/data/sandboxes/a b/v"]


def test_mounts_under_several_prefixes_in_one_read(tmp_path: Path) -> None:
    needs_root()
    first, second = tmp_path / "one two", tmp_path / "three"
    first.mkdir()
    second.mkdir()
    _tmpfs(first)
    (first / "deep").mkdir()
    _tmpfs(first / "deep")
    _tmpfs(second)
    try:
        found = mounts.mounts_under(first, second)
        # deepest first, each once, with its real (unescaped) name
        assert found[0] == str(first / "deep")
        assert sorted(found) == sorted([str(first), str(first / "deep"), str(second)])
        assert mounts.is_mounted(first)
        mounts.unmount_all_under(first, second)
        assert mounts.mounts_under(first, second) == []
    finally:
        for target in (first / "deep", first, second):
            mounts.unmount(target)
