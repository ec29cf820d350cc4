"""The host side of a sandbox's cgroups: where they are, and removing them without a trace.

runc creates and limits the cgroups (from ``linux.resources`` in config.json); sandlot only
needs to find them (for checks and metrics) and to remove leftovers when a create failed
half-way or runc's state was lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PARENT = "sandlot"


_mounts: tuple[Path, ...] = ()


def cgroup_mounts() -> tuple[Path, ...]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones and v2).

    Read once found: the hierarchies are mounted at boot and stay, while mountinfo grows by
    every sandbox's mounts (its overlay and idmapped layers: two lines a sandbox), so
    reading it on each create and delete cost O(sandboxes) in a burst, on a worker thread
    holding the GIL. None found is not kept (asked again next time)."""
    global _mounts
    if not _mounts:
        _mounts = _read_cgroup_mounts()
    return _mounts


def _read_cgroup_mounts() -> tuple[Path, ...]:
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            if fstype in ("cgroup", "cgroup2"):
                found.append(Path(left.split()[4]))
    return tuple(found)


def is_unified_only() -> bool:
    """True on a pure cgroup v2 host (where crun is the better default runtime)."""
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


def cgroups_path(sandbox_id: str) -> str:
    """The ``linux.cgroupsPath`` for a sandbox."""
    return f"/{PARENT}/{sandbox_id}"


def sandbox_cgroup_dirs(sandbox_id: str) -> list[Path]:
    """Existing cgroup directories of the sandbox across all hierarchies."""
    return [d for m in cgroup_mounts() if (d := m / PARENT / sandbox_id).is_dir()]


def controller_dir(sandbox_id: str, controller: str) -> Path | None:
    """The sandbox's directory in the v1 hierarchy of ``controller`` (e.g. ``memory``)."""
    d = Path("/sys/fs/cgroup") / controller / PARENT / sandbox_id
    return d if d.is_dir() else None


def _pids(d: Path) -> set[int]:
    pids: set[int] = set()
    for sub, _dirs, files in os.walk(d):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (Path(sub) / "cgroup.procs").read_text().split())
    return pids


def remove_sandbox_cgroups(sandbox_id: str, timeout: float = 5.0) -> None:
    """Kill whatever still runs in the sandbox's cgroups, thaw them, and remove them."""
    dirs = sandbox_cgroup_dirs(sandbox_id)
    deadline = time.monotonic() + timeout
    for d in dirs:
        state = d / "freezer.state"
        if state.exists():
            for p in _pids(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            with contextlib.suppress(OSError):
                state.write_text("THAWED")
    for d in dirs:
        while True:
            for p in _pids(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            # deepest first: child cgroups made inside the sandbox (if any) go before it
            subdirs = sorted((Path(s) for s, _, _ in os.walk(d)), key=lambda p: len(p.parts),
                             reverse=True)
            try:
                for s in subdirs:
                    if s.exists():
                        s.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def kill_all(sandbox_id: str, timeout: float = 2.0) -> bool:
    """SIGKILL every process of a running (not frozen) sandbox and wait until none is left.

    Done instead of ``runc delete --force``, whose own kill-and-wait loop polls slowly: True
    when none is left (also when the sandbox has no cgroup), so removing the cgroups and
    runc's state is all that remains; False if processes remain or the sandbox is frozen
    (``runc delete --force`` then does the rest).
    """
    dirs = sandbox_cgroup_dirs(sandbox_id)
    freezer = next((d for d in dirs if (d / "freezer.state").exists()), None)
    if freezer is not None and (freezer / "freezer.state").read_text().strip() != "THAWED":
        return False
    probe = next((d for d in dirs if (d / "pids.max").exists()), dirs[0] if dirs else None)
    if probe is None:
        return True
    deadline = time.monotonic() + timeout
    while pids := _pids(probe):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True
