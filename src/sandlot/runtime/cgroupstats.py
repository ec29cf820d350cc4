"""CPU, memory and OOM-kill counts of a container's cgroup, read from the host (v1 and v2).

Every backend on this host (runc, runsc, a local Docker engine) leaves its containers in a
cgroup; its files say what the sandbox uses and whether the kernel killed anything in it for
memory, which is what diagnostics and ``/metrics`` report.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sandlot.runtime.base import ResourceUsage

ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    with contextlib.suppress(ValueError):
        value = int(text)
        return value if value < (1 << 62) else None  # v1's "unlimited"
    return None


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def usage_of_pid(pid: int) -> ResourceUsage | None:
    """The usage of the cgroup ``pid`` is in (None when the process is gone)."""
    text = _read(Path(f"/proc/{pid}/cgroup"))
    if text is None:
        return None
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for controller in parts[1].split(","):
            v1[controller] = parts[2]
    if "memory" in v1:
        return usage_v1(ROOT / "memory" / v1["memory"].lstrip("/"),
                        ROOT / "cpuacct" / v1.get("cpuacct", v1["memory"]).lstrip("/"))
    if v2 is not None:
        return usage_v2(ROOT / v2.lstrip("/"))
    return None


def usage_of_path(relative: str) -> ResourceUsage | None:
    """The usage of the cgroup at ``relative`` (e.g. ``sandlot/<id>``) in either layout."""
    relative = relative.lstrip("/")
    if (ROOT / "cgroup.controllers").exists():
        d = ROOT / relative
        return usage_v2(d) if d.is_dir() else None
    mem = ROOT / "memory" / relative
    return usage_v1(mem, ROOT / "cpuacct" / relative) if mem.is_dir() else None


def usage_of_paths(relatives: dict[str, str]) -> dict[str, ResourceUsage | None]:
    """``usage_of_path`` of each value, by key; one that cannot be read is None."""
    found: dict[str, ResourceUsage | None] = {}
    for key, relative in relatives.items():
        try:
            found[key] = usage_of_path(relative)
        except OSError:
            found[key] = None
    return found


def usage_v2(d: Path) -> ResourceUsage | None:
    memory = _int(d / "memory.current")
    if memory is None and not d.is_dir():
        return None
    cpu = _keyed(d / "cpu.stat").get("usage_usec")
    events = _keyed(d / "memory.events")
    return ResourceUsage(
        cpu_seconds=cpu / 1e6 if cpu is not None else None,
        memory_bytes=memory,
        memory_limit_bytes=_int(d / "memory.max"),
        oom_kills=events.get("oom_kill", 0),
    )


def usage_v1(mem: Path, cpuacct: Path) -> ResourceUsage | None:
    memory = _int(mem / "memory.usage_in_bytes")
    if memory is None and not mem.is_dir():
        return None
    cpu_ns = _int(cpuacct / "cpuacct.usage")
    oom = _keyed(mem / "memory.oom_control")
    return ResourceUsage(
        cpu_seconds=cpu_ns / 1e9 if cpu_ns is not None else None,
        memory_bytes=memory,
        memory_limit_bytes=_int(mem / "memory.limit_in_bytes"),
        oom_kills=oom.get("oom_kill", 0),
    )
