"""The ``ephemeral-storage`` cap: a sandbox's writable layer on a file system of its own size.

The overlay's upper and work dirs must be on one file system, and a cap must hold against
any write pattern (big files, many small ones, sparse files filled later). Chosen, by
measurement on the dev VM (docs/volumes.md): a sparse ext4 image of exactly the cap, made by
``mkfs.ext4`` (no journal: the layer does not outlive a crash anyway) and loop-mounted at
``<sandbox>/rw``. A full layer answers ENOSPC inside; the host only ever gives the image the
blocks written to it. Not chosen: project quotas (need an XFS data dir, or an ext4 made with
the ``project`` feature and remounted with ``prjquota`` - neither is true of a usual root file
system), and tmpfs (RAM, charged to the sandbox's memory limit).

The loop device runs with direct I/O (no second page-cache copy of what the sandbox writes).
Cost: ~40 ms of mkfs plus ~20-60 ms of mount per create, paid by the warm pool ahead of
time for the configured default size; unmount (which frees the loop device, ``autoclear``)
is part of the teardown's unmount of everything below the sandbox folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sandlot.errors import RuntimeFailure
from sandlot.runtime.hosttools import run_tool

log = logging.getLogger(__name__)
IMAGE_NAME = "rw.img"


def mkfs_argv(image: Path) -> list[str]:
    """A journal-less ext4 filling the sparse file ``image`` (root-owned root, no reserve)."""
    return ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
            "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", str(image)]


def mount_argv(image: Path, mount_point: Path) -> list[str]:
    return ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image),
            str(mount_point)]


async def mount_limited(root: Path, mount_point: Path, size: int) -> None:
    """Make a ``size``-byte ext4 at ``root/rw.img`` and loop-mount it on ``mount_point``."""
    image = root / IMAGE_NAME
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)  # sparse: blocks are only taken when written
    finally:
        os.close(fd)
    mkfs = await run_tool(mkfs_argv(image), timeout=60)
    if not mkfs.ok:
        raise RuntimeFailure(f"cannot make the sandbox's {size}-byte file system: "
                             f"{mkfs.stderr.decode(errors='replace').strip()}")
    mount_point.mkdir(mode=0o700, exist_ok=True)
    mnt = await run_tool(mount_argv(image, mount_point), timeout=60)
    if not mnt.ok:
        raise RuntimeFailure(f"cannot mount the sandbox's file system: "
                             f"{mnt.stderr.decode(errors='replace').strip()}")
    (mount_point / "lost+found").rmdir()
    await _direct_io(mount_point)


async def _direct_io(mount_point: Path) -> None:
    """Let the loop device bypass the page cache of the image file.

    Without it every block the sandbox writes is cached twice (its ext4's pages and the image
    file's), and the second copy is not charged to the sandbox's memory cgroup. ``mount -o
    loop`` cannot ask for it; the attached device can be switched. Not fatal: only a cost.
    """
    device = source_of(mount_point)
    if device is None or not device.startswith("/dev/loop"):
        return
    res = await run_tool(["losetup", "--direct-io=on", device], timeout=30)
    if not res.ok:
        log.warning("loop device %s of %s stays on buffered I/O: %s", device, mount_point,
                    res.stderr.decode(errors="replace").strip())


def source_of(mount_point: Path) -> str | None:
    target = os.path.realpath(mount_point)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if fields[4] == target:
                return fields[fields.index("-") + 2]
    return None
