"""Who code kernels run as: the image's ``User``, as commands and the entrypoint do.

execd itself stays root (it must reach every user's files and signal every process); each
kernel process is started with that user's uid and gid and no supplementary groups. Set once
per execd process by ``build_extension`` (one image, one user), read by every place that
starts a kernel, so the identity is not threaded through each kernel class.
"""

from __future__ import annotations

import os
from typing import Any

_identity: tuple[int, int] | None = None


def configure(uid: int | None, gid: int | None) -> None:
    """Run kernels as ``uid``:``gid`` (None: as execd, i.e. root, the image's default)."""
    global _identity
    _identity = None if uid is None or uid == 0 else (uid, gid if gid is not None else uid)


def current() -> tuple[int, int] | None:
    return _identity


def popen_kwargs() -> dict[str, Any]:
    """``subprocess``/``asyncio`` keyword arguments that start a process as the kernel user."""
    if _identity is None:
        return {}
    uid, gid = _identity
    return {"user": uid, "group": gid, "extra_groups": []}


def prepare_connection_file(km: Any) -> None:
    """Make a Jupyter kernel manager's connection file readable by the kernel user.

    jupyter_client writes it 0600 for its own (root) user just before launching, and would
    choose ports again first (``cache_ports``); writing it here, with the ports it chose,
    and handing it to the user keeps one consistent file the kernel can read (the manager
    does not rewrite a file it has written, restarts included).
    """
    if _identity is None:
        return
    km.cache_ports = False
    km.write_connection_file()
    os.chown(km.connection_file, *_identity)
