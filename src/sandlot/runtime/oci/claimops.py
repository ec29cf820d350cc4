"""What claiming a running warm container changes from the host: limits and hostname.

A warm container was started with no limits but the runtime's pids cap and a hostname of its
pool id. Both are fixed here without forking anything: the cgroup files are written directly
(what ``runc update`` would do, minus ~15 ms of fork/exec), and the hostname is set from a
worker thread that setns()es into the container's UTS namespace and back (the host has
CAP_SYS_ADMIN; the container, which must not change it, does not).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

from sandlot.runtime.oci import cgroups

CLONE_NEWUTS = 0x04000000
CPU_PERIOD_US = 100_000
_ROOT = Path("/sys/fs/cgroup")
_libc = ctypes.CDLL(None, use_errno=True)
_uts_lock = threading.Lock()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


# CPU weight of a warm (unclaimed) container against the default: low enough that starting
# and idling it barely slows sandboxes in use, high enough that it still starts under load.
WARM_CPU_SHARES = 64
DEFAULT_CPU_SHARES = 1024  # cgroup v1 default
DEFAULT_CPU_WEIGHT = 100  # cgroup v2 default


def apply_limits(
    container_id: str,
    *,
    cpu_cores: float | None,
    memory_bytes: int | None,
    pids: int,
    swap_limit: bool,
) -> None:
    """Set cpu/memory/pids of a running container (cgroup v1, or v2 when unified only)."""
    quota = None if cpu_cores is None else max(1000, int(cpu_cores * CPU_PERIOD_US))
    if cgroups.is_unified_only():
        d = _ROOT / cgroups.PARENT / container_id
        _write(d / "cpu.weight", str(DEFAULT_CPU_WEIGHT))
        if memory_bytes is not None:
            _write(d / "memory.max", str(memory_bytes))
            if swap_limit and (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")  # memory+swap == memory
        if quota is not None:
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        _write(d / "pids.max", str(pids))
        return
    if memory_bytes is not None:
        mem = _need(container_id, "memory")
        # memsw must stay >= memory: lower memory first, then memsw (both start unlimited).
        _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        if swap_limit and (mem / "memory.memsw.limit_in_bytes").exists():
            _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
    cpu = _need(container_id, "cpu")
    _write(cpu / "cpu.shares", str(DEFAULT_CPU_SHARES))  # warm containers start low
    if quota is not None:
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
    _write(_need(container_id, "pids") / "pids.max", str(pids))


def record_limits(
    config_json: Path, *, cpu_cores: float | None, memory_bytes: int | None, pids: int,
    swap_limit: bool,
) -> None:
    """Write the claimed limits into the container's config.json (read again by a restore)."""
    config = json.loads(config_json.read_text())
    res = config.setdefault("linux", {}).setdefault("resources", {})
    res["pids"] = {"limit": pids}
    res["cpu"] = {"shares": DEFAULT_CPU_SHARES}
    if cpu_cores is not None:
        res["cpu"].update(quota=max(1000, int(cpu_cores * CPU_PERIOD_US)), period=CPU_PERIOD_US)
    if memory_bytes is not None:
        res["memory"] = {"limit": memory_bytes, **({"swap": memory_bytes} if swap_limit else {})}
    tmp = config_json.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, separators=(",", ":")))  # the C encoder: see _create
    os.replace(tmp, config_json)


def _need(container_id: str, controller: str) -> Path:
    d = cgroups.controller_dir(container_id, controller)
    if d is None:
        raise FileNotFoundError(f"no {controller} cgroup for container {container_id}")
    return d


def init_pid(runc_root: Path, container_id: str) -> int:
    """The container's init pid from runc's state file (no ``runc state`` fork)."""
    state = json.loads((runc_root / container_id / "state.json").read_text())
    pid = int(state["init_process_pid"])
    if pid <= 0:
        raise ProcessLookupError(f"container {container_id} has no init process")
    return pid


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWUTS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def set_hostname(pid: int, name: str) -> None:
    """Set the hostname in ``pid``'s UTS namespace. Run on a worker thread (it setns()es)."""
    raw = name.encode()
    with _uts_lock, open(f"/proc/self/task/{threading.get_native_id()}/ns/uts") as home:
        with open(f"/proc/{pid}/ns/uts") as target:
            _setns(target.fileno())
        try:
            if _libc.sethostname(raw, len(raw)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sethostname: {os.strerror(err)}")
        finally:
            # A thread left in a sandbox's namespace would be a host bug: never tolerated.
            try:
                _setns(home.fileno())
            except OSError:
                os.abort()
