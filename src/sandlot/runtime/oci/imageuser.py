"""The image config's ``User`` ("name", "uid", "uid:gid", "name:group") as numeric ids.

Names are looked up in the image's own /etc/passwd and /etc/group, read from its layers
(top-most first) without following symlinks: an image is untrusted input, and a link to a
host path must not make the server read host files.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sandlot.errors import InvalidRequest


def _read_image_file(layers: list[Path], *parts: str) -> str | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for layer in layers:
        fds: list[int] = []
        try:
            fds.append(os.open(layer, flags | os.O_DIRECTORY))
            for part in parts[:-1]:
                fds.append(os.open(part, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
            fds.append(os.open(parts[-1], flags, dir_fd=fds[-1]))
            with os.fdopen(os.dup(fds[-1]), "rb") as fh:
                return fh.read(4 << 20).decode(errors="replace")
        except OSError:
            continue
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return None


def _entries(text: str | None) -> list[list[str]]:
    return [ln.split(":") for ln in (text or "").splitlines() if ln and not ln.startswith("#")]


def resolve_user(user: str | None, layers: list[Path]) -> tuple[int, int] | None:
    """``(uid, gid)`` for ``user``; None for root or an unset user."""
    if not user or user in ("root", "0", "0:0", "root:root"):
        return None
    name, _, group = user.partition(":")
    passwd = _entries(_read_image_file(layers, "etc", "passwd"))
    uid = gid = None
    for entry in passwd:
        if len(entry) >= 4 and (entry[0] == name or entry[2] == name):
            with contextlib.suppress(ValueError):
                uid, gid = int(entry[2]), int(entry[3])
                break
    if uid is None:
        if not name.isdigit():
            raise InvalidRequest(f"image user {name!r} is not in the image's /etc/passwd")
        uid, gid = int(name), 0
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = [e for e in _entries(_read_image_file(layers, "etc", "group"))
                     if len(e) >= 3 and e[0] == group and e[2].isdigit()]
            if not found:
                raise InvalidRequest(f"image group {group!r} is not in the image's /etc/group")
            gid = int(found[0][2])
    return uid, gid or 0
