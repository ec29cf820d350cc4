"""Telling an out-of-memory kill apart from other kernel deaths, from the kernel's memory cgroup.

The kernel is SIGKILLed by the OOM killer when the sandbox's memory limit is hit; the memory
cgroup's ``oom_kill`` counter (cgroup v2 ``memory.events``, v1 ``memory.oom_control``) says whether
that is what happened. Where the counter cannot be read, a SIGKILL is taken as an OOM kill.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sandlot.execd.metrics import CgroupPaths


@lru_cache(maxsize=64)
def memory_cgroup(pid: int) -> Path | None:
    """The directory of ``pid``'s memory cgroup (v1 ``memory`` controller or the v2 tree),
    found the same way execd's metrics find their own. Cached: a kernel's cgroup is the
    sandbox's and does not change, and every run of a cell asks (a few file reads, ~3 % of
    execd's samples of a warm ``1+1``); a reused pid is a process of the same sandbox."""
    paths = CgroupPaths.discover(f"/proc/{pid}/cgroup")
    found = paths.memory or paths.v2
    return Path(found) if found else None


@lru_cache(maxsize=64)
def _counter_file(cgroup: Path) -> str | None:
    """The file holding ``cgroup``'s ``oom_kill`` counter (v2 ``memory.events``, v1
    ``memory.oom_control``). Cached: on v1 every run first failed to open the v2 name."""
    for name in ("memory.events", "memory.oom_control"):
        if (cgroup / name).is_file():
            return str(cgroup / name)
    return None


def oom_kills(cgroup: Path | None) -> int | None:
    """How many OOM kills this cgroup has seen; ``None`` when unknown."""
    path = _counter_file(cgroup) if cgroup is not None else None
    if path is None:
        return None
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class OomWatch:
    """Snapshot a kernel's OOM counter before a run, then judge its death afterwards."""

    def __init__(self, pid: int | None):
        self._cgroup = memory_cgroup(pid) if pid else None
        self._before = oom_kills(self._cgroup)

    def was_oom(self, killed_by_sigkill: bool) -> bool:
        if not killed_by_sigkill:
            return False
        after = oom_kills(self._cgroup)
        if self._before is None or after is None:
            return True
        return after > self._before


OOM_MESSAGE = (
    "The code ran out of memory: the kernel was killed for going over the sandbox memory limit. "
    "Process the data in smaller pieces (chunks, fewer rows or columns, streaming) and try again. "
    "The context was reset: the next run starts in a fresh kernel, so earlier variables and "
    "imports are gone."
)
