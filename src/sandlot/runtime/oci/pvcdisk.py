"""A pvc volume's ``storage`` size on the OCI runtime: the claim's own loop-mounted ext4.

The same mechanism as the ``ephemeral-storage`` cap (``disklimit``: a sparse ext4 image of
exactly the size, loop-mounted ``nosuid,nodev``), made once when the claim is made, at
``<claim>/disk.img`` and mounted on ``<claim>/data``. Every sandbox naming the claim binds
that mount, so they share the cap; a write past it is ENOSPC inside, and the host only
gives the image the blocks written to it. The mount outlives the server (a restart finds it
in place); after a host reboot the next use of the claim mounts the image again. Removing
the claim unmounts it (which frees the loop device) before deleting the files.

Synchronous: called by ``PvcStore`` under its file lock, in a worker thread.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandlot.errors import RuntimeFailure
from sandlot.runtime.oci import disklimit, mounts

IMAGE_NAME = "disk.img"
TOOL_TIMEOUT = 60.0


def image_of(claim_root: Path) -> Path:
    return claim_root / IMAGE_NAME


def _run(argv: list[str], what: str) -> None:
    try:
        res = subprocess.run(argv, capture_output=True, timeout=TOOL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"cannot {what}: {exc}") from exc
    if res.returncode != 0:
        raise RuntimeFailure(f"cannot {what}: {res.stderr.decode(errors='replace').strip()}")


def make(claim_root: Path, data: Path, size: int) -> None:
    """Make the claim's ``size``-byte file system and mount it on ``data`` (an empty dir)."""
    image = image_of(claim_root)
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)  # sparse
    finally:
        os.close(fd)
    _run(disklimit.mkfs_argv(image), f"make the {size}-byte file system of a pvc volume")
    ensure_mounted(claim_root, data)
    (data / "lost+found").rmdir()
    os.chmod(data, 0o755)  # like an unsized claim's root (docs/volumes.md: ownership)


def ensure_mounted(claim_root: Path, data: Path) -> None:
    """Mount the claim's image on ``data`` unless it already is (e.g. after a reboot)."""
    if os.path.ismount(data):
        return
    _run(disklimit.mount_argv(image_of(claim_root), data), "mount a pvc volume's file system")
    device = disklimit.source_of(data)
    if device is not None and device.startswith("/dev/loop"):
        # no second page-cache copy of the volume's blocks; only a cost when it fails
        subprocess.run(["losetup", "--direct-io=on", device], capture_output=True,
                       timeout=TOOL_TIMEOUT, check=False)


def unmount(data: Path) -> None:
    """Unmount the claim's file system (before its files are deleted)."""
    if os.path.ismount(data):
        mounts.unmount(data)
    if os.path.ismount(data):
        raise RuntimeFailure(f"pvc volume file system at {data} is still mounted")
