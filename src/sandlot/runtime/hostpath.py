"""Open a directory below a trusted root without following any symbolic link on the way.

Volume sources live in directories a sandbox (or another host user) may write: a check of
the path followed by a mount of the same *path* could be raced by a link swapped in between.
So the path is walked one component at a time with ``O_PATH | O_NOFOLLOW`` relative to the
previous directory (what ``openat2(RESOLVE_NO_SYMLINKS)`` does; Python's ``os`` has no
openat2), and the mount is then made from the resulting descriptor (``/proc/self/fd/N``),
never from the path again.
"""

from __future__ import annotations

import errno
import os
import stat

O_PATH = getattr(os, "O_PATH", 0o10000000)


class PathEscape(OSError):
    """A component of the path is a symbolic link, or not a directory."""


def open_beneath(root: str, relative: str, *, create: bool = False, mode: int = 0o755) -> int:
    """An ``O_PATH`` descriptor of directory ``root/relative``; the caller closes it.

    ``root`` itself is trusted (resolved normally); no component of ``relative`` may be a
    symbolic link or ``..``. With ``create`` missing directories are made (``mode``).
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(errno.EINVAL, f"'..' in {relative!r}")
    fd = os.open(root, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                # O_PATH fds cannot be used with mkdirat in every kernel/Python combination:
                # go through /proc/self/fd, which names exactly this directory.
                with _dir_fd(fd) as real:
                    try:
                        os.mkdir(part, mode, dir_fd=real)
                    except FileExistsError:
                        pass
                nxt = os.open(part, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            st = os.fstat(nxt)
            if not stat.S_ISDIR(st.st_mode):
                os.close(nxt)
                what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                shown = "/".join(parts[: i + 1])
                raise PathEscape(errno.ELOOP, f"{shown!r} is {what}")
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class _dir_fd:
    """A real (not O_PATH) directory descriptor re-opened from an O_PATH one."""

    def __init__(self, path_fd: int) -> None:
        self._fd = os.open(fd_path(path_fd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self) -> int:
        return self._fd

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def fd_path(fd: int) -> str:
    """The magic link naming exactly what ``fd`` refers to (for mount(2) and re-opens)."""
    return f"/proc/self/fd/{fd}"
