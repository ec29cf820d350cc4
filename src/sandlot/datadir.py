"""The data dir is root's alone: created 0700, checked at every start, files in it 0600.

It holds every sandbox's files, the database and the server secret; another host user who
can read it can drive any sandbox's execd (as root inside). A data dir that other users can
read or write is refused, with the command that fixes it, rather than silently chmod-ed:
something else may have made it so on purpose, and the operator should know.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path

from sandlot.errors import SandlotError


class UnsafeDataDir(SandlotError):
    status = 500
    code = "UNSAFE_DATA_DIR"


def create(data_dir: Path) -> Path:
    """Create ``data_dir`` 0700 when missing (an existing one is left as it is). Whatever
    makes the data dir first (serve, ``sandlot image``, doctor, init-config, the bench's
    image cache) goes through here, so serve never finds one it made itself too open."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return data_dir


def prepare(data_dir: Path) -> Path:
    """Create ``data_dir`` 0700 when missing; refuse one other users can reach."""
    check(create(data_dir))
    return data_dir


def check(data_dir: Path) -> None:
    st = os.lstat(data_dir)
    if stat.S_ISLNK(st.st_mode):
        # The check and every later open go through the link: its target is what counts.
        st = os.stat(data_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDataDir(f"data dir {data_dir} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDataDir(
            f"data dir {data_dir} is owned by uid {st.st_uid}, not by this server's uid "
            f"{os.geteuid()}: run `chown {os.geteuid()} {data_dir}` or choose another data dir"
        )
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose:
        raise UnsafeDataDir(
            f"data dir {data_dir} is accessible to other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); it holds sandbox secrets and files: run "
            f"`chmod 700 {data_dir}` before starting sandlot"
        )


def private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 when missing; make an existing one 0600."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def owner_id(data_dir: Path, name: str) -> str:
    """A random id kept in ``data_dir/name``, made once: it labels what this server owns in a
    shared engine or cluster, so two servers never adopt each other's sandboxes."""
    path = data_dir / name
    with contextlib.suppress(FileNotFoundError):
        value = path.read_text().strip()
        if value:
            return value
    value = uuid.uuid4().hex
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value
