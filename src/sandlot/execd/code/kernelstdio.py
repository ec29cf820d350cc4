"""Where Jupyter kernels' own stdout and stderr go: a capped log in the sandbox.

Started plainly, a kernel inherits execd's stdio, which is the container log on the host.
ipykernel copies everything written to the kernel's descriptors 1 and 2 (a subprocess's
output included) to the descriptors it started with, and hands those out as
``sys.stdout.fileno()``, so one cell (``subprocess.run("yes", shell=True)``) could grow that
host file without bound. Kernels get one shared pipe instead, copied by execd into a capped,
rotated log beside the entrypoint's (``/run/sandlot/kernels.log``; cappedlog.py), as the
entrypoint's output is. execd keeps the pipe's write end for its lifetime, so a kernel
restarted by its manager (which reuses the start's arguments) finds it open.

Set once per execd process by ``build_extension`` (the path follows ``--entrypoint-log``,
which every backend passes); without one (execd run by hand) kernels keep execd's stdio.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sandlot.execd.cappedlog import CappedLog, copy_pipe_into

log = logging.getLogger(__name__)

_path: str | None = None
_write_end: int | None = None


def configure(path: str | None) -> None:
    """Send kernels' stdout and stderr into a capped log at ``path`` (None: execd's stdio)."""
    global _path
    _path = path


def popen_kwargs() -> dict[str, Any]:
    """``stdout``/``stderr`` keyword arguments for a kernel process (empty: execd's own).
    The pipe and its copier start on first use, from the running event loop."""
    global _write_end
    if _path is None:
        return {}
    if _write_end is None:
        _write_end = _open_pipe(_path)
    return {"stdout": _write_end, "stderr": _write_end}


def _open_pipe(path: str) -> int:
    try:
        capped = CappedLog(path)
    except OSError as exc:  # never fall back to the host-side log
        log.warning("kernel output discarded: cannot open %s: %s", path, exc)
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    copy_pipe_into(read_end, capped)  # no end of file: execd holds the write end
    return write_end
