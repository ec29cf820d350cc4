"""Which host file system a path is on, as far as sandlot's speed depends on it.

ext4 without a journal makes every new inode skip those freed in the last minute (it cannot
tell whether their freeing reached the disk), with a buffer-cache look-up for each. A
sandbox create makes about thirty files and folders in the data dir and deletes as many, so
on such a file system each create after a burst of deletes scans thousands of them: measured
on this project's bench VM, 100-create bursts after deletes took the server from 10 to 16-22
ms of CPU per create and their p99 from 3.0 to 3.4-4.1 s, where a journaled ext4 on the same
disk stayed at 9-12 ms and 2.8-3.3 s (docs/benchmarks.md). ``sandlot doctor`` and
``sandlot serve`` say so when the data dir is on one.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
SYS = Path("/sys")


def block_device_name(path: Path, sys_root: Path = SYS) -> str | None:
    """The kernel's name (``vda``, ``sda1``, ``loop0``) of the block device holding ``path``,
    or None when it is on none (tmpfs, overlay, a network file system)."""
    st = os.stat(path)
    link = sys_root / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        return link.resolve(strict=True).name
    except OSError:
        return None


def ext4_without_journal(path: Path, *, proc_root: Path = PROC,
                         sys_root: Path = SYS) -> str | None:
    """The device name when ``path`` is on an ext4 file system that has no journal, else None.

    A mounted ext4 has ``/proc/fs/ext4/<device>``; a journaled one also has its journal's
    ``/proc/fs/jbd2/<device>-<inode>`` (``-8`` for the usual internal journal)."""
    device = block_device_name(path, sys_root)
    if device is None or not (proc_root / "fs" / "ext4" / device).is_dir():
        return None
    jbd2 = proc_root / "fs" / "jbd2"
    if jbd2.is_dir() and any(entry.name.startswith(f"{device}-") for entry in jbd2.iterdir()):
        return None
    return device


def journal_advice(path: Path, device: str) -> str:
    """The warning for a data dir on journal-less ext4."""
    return (f"{path} is on ext4 without a journal (/dev/{device}): every file or folder a "
            "create makes scans the inodes freed in the last minute, so creates slow down "
            "after deletes (bursts after deletes: about 1.5-2x the server's CPU per create)")


JOURNAL_FIX = ("put data_dir on a journaled ext4 (the mkfs.ext4 default; `tune2fs -O "
               "has_journal` on the unmounted device adds one) or on XFS")
