"""Process-level measurements: RSS/USS of the server and of execd daemons, host memory, CPU."""

from __future__ import annotations

import ctypes
import os
import resource
import time
from collections.abc import Collection, Iterable
from pathlib import Path

import psutil

MB = 1e6


def host_used_bytes() -> int:
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def uss(pid: int) -> int:
    """Unique set size (memory freed if the process exited); RSS if USS is unreadable."""
    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except psutil.Error:
        return rss(pid)


def tree_pids(pid: int) -> list[int]:
    try:
        proc = psutil.Process(pid)
        return [pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.Error:
        return []


def is_execd(cmd: list[str]) -> bool:
    """``python -m sandlot.execd ...`` (as sandboxes run it) or ``sandlot execd ...``."""
    if any("pytest" in a or "py-spy" in a for a in cmd[:3]):
        return False
    for i, arg in enumerate(cmd):
        if arg == "sandlot.execd":
            return True
        if arg == "sandlot.execd.zygote":  # the zygote, or an execd forked from it
            return True
        if arg == "execd" and i > 0 and os.path.basename(cmd[i - 1]) == "sandlot":
            return True
    return False


def _in_a_sandbox(pid: int) -> bool:
    """Whether ``pid`` runs in a pid namespace other than ours (a sandbox's)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def cgroup_paths(pid: int) -> dict[str, str]:
    """controller (``memory``, ``""`` for v2) -> cgroup path of ``pid``."""
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    out[c] = path
    except (OSError, ValueError):
        pass
    return out


def cgroup_memory_bytes(pid: int) -> int | None:
    """Memory charged to ``pid``'s cgroup (v1 ``memory.usage_in_bytes`` or v2
    ``memory.current``): everything the container uses, page cache included."""
    paths = cgroup_paths(pid)
    candidates = []
    if "memory" in paths:
        candidates.append(Path("/sys/fs/cgroup/memory") / paths["memory"].lstrip("/")
                          / "memory.usage_in_bytes")
    if "" in paths:
        rel = paths[""].lstrip("/")
        candidates += [Path("/sys/fs/cgroup") / rel / "memory.current",
                       Path("/sys/fs/cgroup/unified") / rel / "memory.current"]
    for path in candidates:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def execd_pids(sandbox_ids: Collection[str] | None = None) -> set[int]:
    """Processes that are an execd daemon (the top one of each family); with
    ``sandbox_ids``, only those whose cgroup path names one of these sandboxes."""
    found: set[int] = set()
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
        except psutil.Error:
            continue
        if proc.info["pid"] == me or not cmd or not is_execd(cmd):
            continue
        if "sandlot.execd.zygote" in cmd and not _in_a_sandbox(int(proc.info["pid"])):
            continue  # the zygote itself (host side), not an execd
        if sandbox_ids is not None:
            paths = " ".join(cgroup_paths(int(proc.info["pid"])).values())
            if not any(sid in paths for sid in sandbox_ids):
                continue
        found.add(int(proc.info["pid"]))
    # A daemon that forks workers: keep the top-most execd of each family.
    tops = set()
    for pid in found:
        try:
            parent = psutil.Process(pid).ppid()
        except psutil.Error:
            continue
        if parent not in found:
            tops.add(pid)
    return tops


def self_cpu_seconds() -> float:
    """User + system CPU of this process so far (a measuring client's own cost)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# The C library already loaded into this interpreter (``find_library`` would run ldconfig
# at import to find it again).
_LIBC = ctypes.CDLL(None, use_errno=True)


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time of ``pid`` (all its threads, exited ones too) at the scheduler's nanosecond
    resolution; None when it is gone. ``cpu_seconds`` counts clock ticks (10 ms here),
    too coarse for one operation's CPU. The process's CPU clock comes from glibc's
    ``clock_getcpuclockid``, which Python's ``time`` module does not expose."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return None
    try:
        return time.clock_gettime_ns(clock.value) / 1e9
    except OSError:  # the process ended between the two calls
        return None


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def cpu_percent_over(pids: list[int], seconds: float) -> float:
    """CPU used by ``pids`` (those alive throughout) over a window, in % of one core."""
    before = cpu_seconds(pids)
    t0 = time.perf_counter()
    time.sleep(seconds)
    after = cpu_seconds(pids)
    used = sum(after[p] - before[p] for p in after if p in before)
    return 100.0 * used / (time.perf_counter() - t0)
