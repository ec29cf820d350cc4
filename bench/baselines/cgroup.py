"""A host baseline's CPU share made like a sandbox's: run it in sandlot's cgroup parent.

sandlot puts every sandbox in ``/sandlot/<id>``. On a loaded host the scheduler gives that
parent one share of the CPU for all sandboxes together, while a process of the host (the
bench's ``scandir``+``stat``, a host Jupyter kernel) competes as one task of the root group
of its own. ``SharedParentCpu`` moves the calling thread (cgroup v1's ``tasks`` takes thread
ids) into ``/sandlot/<name>`` with a claimed sandbox's ``cpu.shares`` for a block, so what
it runs, and the processes it starts, get the share a sandbox gets. On a quiet host the two
are the same; on a pure cgroup v2 host (no per-thread moves) it is unavailable.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sandlot.runtime.oci import cgroups
from sandlot.runtime.oci.claimops import DEFAULT_CPU_SHARES

_CPU = Path("/sys/fs/cgroup/cpu")


def _current_cpu_cgroup() -> Path:
    """The cpu cgroup directory the calling thread is in (v1)."""
    for line in Path("/proc/thread-self/cgroup").read_text().splitlines():
        _num, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return _CPU / path.lstrip("/")
    return _CPU


class SharedParentCpu:
    """A cpu cgroup ``/sandlot/<name>`` for host baselines (cgroup v1 only)."""

    def __init__(self, name: str):
        self.dir = _CPU / cgroups.PARENT / name

    @staticmethod
    def available() -> bool:
        return (_CPU / "tasks").exists() and os.access(_CPU, os.W_OK)

    @contextlib.contextmanager
    def thread_inside(self) -> Iterator[None]:
        """Run the block (and the processes it starts) in the cgroup, then move back."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "cpu.shares").write_text(str(DEFAULT_CPU_SHARES))
        home = _current_cpu_cgroup()
        tid = str(threading.get_native_id())
        (self.dir / "tasks").write_text(tid)
        try:
            yield
        finally:
            (home / "tasks").write_text(tid)

    def remove(self, timeout: float = 10.0) -> None:
        """Remove the cgroup once the processes started inside have exited (threads this
        process started inside, e.g. a ZMQ context's I/O thread, are moved back first)."""
        if self.dir.exists():
            own = set(os.listdir("/proc/self/task"))
            for tid in (self.dir / "tasks").read_text().split():
                if tid in own:
                    with contextlib.suppress(OSError):
                        (_CPU / "tasks").write_text(tid)
        deadline = time.monotonic() + timeout
        while self.dir.exists():
            try:
                self.dir.rmdir()
            except FileNotFoundError:
                return
            except OSError:  # EBUSY: a process started inside is still exiting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
