"""Idmapped mounts: an image's layer seen with its owners shifted into a sandbox's uid range.

With a user namespace, uid 0 in a sandbox is an unprivileged host uid (``base``). The image
layers on disk belong to host root; an idmapped bind mount of a layer (``mount_setattr``
with ``MOUNT_ATTR_IDMAP``, Linux >= 5.12; overlayfs accepts such lower layers since 5.19)
shows them owned by ``base + uid`` without copying or chowning a byte, so one unpacked
layer serves every sandbox, each in its own range.

The kernel takes the mapping from a user namespace file descriptor; ``userns_fd`` makes one
by starting ``unshare --user`` (vfork/exec, cheap; no ``fork()`` of the server), writing its
maps and keeping only the namespace. The new mount API calls have no Python binding: they
are made through ``syscall(2)``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import time
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

# x86_64 system call numbers (the same on arm64 for these, which use the generic table).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x00100000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


Mapping = list[tuple[int, int, int]]  # (id inside, id outside, count): uid_map lines


def userns_fd(base: int, count: int) -> int:
    """An fd of a new user namespace mapping ids ``0..count-1`` to ``base..base+count-1``."""
    return userns_fd_mapped([(0, base, count)], [(0, base, count)])


def owner_mapping(base: int, owner: int, count: int) -> Mapping:
    """A volume's mount idmapping: on-disk ``owner`` is the sandbox's root (host ``base``),
    every other on-disk id ``k`` in ``1..count-1`` is the sandbox's ``k`` (host ``base+k``).

    On-disk root (when ``owner`` is not root) and the sandbox's own ``owner`` id are left
    unmapped: root's files show as the overflow id inside and nobody in the sandbox acts as
    host root there (see docs/volumes.md). ``owner`` 0 gives the plain range mapping.
    """
    if owner == 0:
        return [(0, base, count)]
    lines = [(owner, base, 1)]
    if owner >= count:
        return [*lines, (1, base + 1, count - 1)]
    if owner > 1:
        lines.append((1, base + 1, owner - 1))
    if owner < count - 1:
        lines.append((owner + 1, base + owner + 1, count - owner - 1))
    return lines


def userns_fd_mapped(uid_map: Mapping, gid_map: Mapping) -> int:
    """An fd of a new user namespace with these uid and gid maps (the caller closes it)."""
    own = os.readlink("/proc/self/ns/user")
    proc = subprocess.Popen(["unshare", "--user", "sleep", "30"],  # noqa: S607 - util-linux
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        ns_link = f"/proc/{proc.pid}/ns/user"
        deadline = time.monotonic() + 5
        while True:  # until the child has entered its new namespace
            try:
                if os.readlink(ns_link) != own:
                    break
            except FileNotFoundError:
                pass
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise OSError(errno.EPERM, f"unshare --user failed: {err.strip()}")
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, "unshare --user did not start")
            time.sleep(0.0002)
        for name, lines in (("uid_map", uid_map), ("gid_map", gid_map)):
            with open(f"/proc/{proc.pid}/{name}", "w") as fh:  # one write(2), as required
                fh.write("".join(f"{i} {o} {n}\n" for i, o, n in lines))
        return os.open(ns_link, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def idmapped_bind(source: Path, target: Path, ns_fd: int, *, read_only: bool = True) -> None:
    """Bind ``source`` on ``target`` with owners shifted by ``ns_fd``'s mapping."""
    tree = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, str(source).encode(),
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC), f"open_tree {source}")
    _attach_idmapped(tree, source, target, ns_fd, read_only)


def idmapped_bind_fd(source_fd: int, target: Path, ns_fd: int, *, read_only: bool) -> None:
    """Like ``idmapped_bind`` for the directory ``source_fd`` (an ``O_PATH`` descriptor):
    the path is never looked up again, so no link swapped in meanwhile is followed."""
    tree = _check(_libc.syscall(SYS_OPEN_TREE, source_fd, b"",
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH),
                  f"open_tree fd {source_fd}")
    _attach_idmapped(tree, Path(f"fd {source_fd}"), target, ns_fd, read_only)


def _attach_idmapped(tree: int, source: Path, target: Path, ns_fd: int,
                     read_only: bool) -> None:
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                          | (MOUNT_ATTR_RDONLY if read_only else 0), 0, 0, ns_fd)
        _check(_libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr),
                             ctypes.c_size_t(ctypes.sizeof(attr))), f"idmap {source}")
        _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, str(target).encode(),
                             MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {target}")
    finally:
        os.close(tree)


def supported() -> bool:
    """Whether this kernel idmaps mounts (tried once on a scratch directory)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sandlot-idmap-") as tmp:
        src, dst = Path(tmp, "src"), Path(tmp, "dst")
        src.mkdir()
        dst.mkdir()
        try:
            fd = userns_fd(1 << 30, 65536)
        except OSError:
            return False
        try:
            idmapped_bind(src, dst, fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        ok = os.stat(dst).st_uid == 1 << 30
        _libc.umount2(str(dst).encode(), 2)
        return ok
