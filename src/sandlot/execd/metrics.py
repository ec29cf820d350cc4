"""``/metrics`` and ``/metrics/watch``: CPU and memory of the sandbox, from its cgroup.

The limits come from the cgroup execd itself runs in (v2: ``memory.max``, ``cpu.max``;
v1: ``memory.limit_in_bytes``, ``cpu.cfs_quota_us``), falling back to the host's values
when a controller is unlimited or unreadable. CPU usage is the cgroup's CPU time between
two samples divided by wall time and by the CPU count (so 100 % = every allowed CPU busy).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandlot.execd import sse
from sandlot.execd.http import JSON
from sandlot.execd.settings import Settings

CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED = 1 << 60


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _int(path: str) -> int | None:
    raw = _read(path)
    if raw is None or raw == "max":
        return None
    try:
        return int(raw.split()[0])
    except (ValueError, IndexError):
        return None


@dataclass
class CgroupPaths:
    """Where this process's cgroup files are (v2 unified dir, or v1 per-controller dirs)."""

    v2: str | None = None
    memory: str | None = None
    cpuacct: str | None = None
    cpu: str | None = None

    @classmethod
    def discover(
        cls, proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT
    ) -> CgroupPaths:
        found = cls()
        text = _read(proc_cgroup) or ""
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            if controllers == "" and os.path.exists(os.path.join(root, "cgroup.controllers")):
                found.v2 = _first_existing(root, path, "memory.current")
                continue
            for ctrl in controllers.split(","):
                if ctrl in ("memory", "cpuacct", "cpu"):
                    base = _controller_dir(root, controllers, ctrl)
                    if base:
                        setattr(found, ctrl, _first_existing(base, path, _probe_file(ctrl)))
        return found


def _probe_file(ctrl: str) -> str:
    return {
        "memory": "memory.usage_in_bytes",
        "cpuacct": "cpuacct.usage",
        "cpu": "cpu.cfs_quota_us",
    }[ctrl]


def _controller_dir(root: str, controllers: str, ctrl: str) -> str | None:
    for name in (controllers, ctrl, ",".join(sorted(controllers.split(",")))):
        candidate = os.path.join(root, name)
        if os.path.isdir(candidate):
            return candidate
    return None


def _first_existing(base: str, path: str, probe: str) -> str | None:
    """The cgroup dir as seen from here: inside a container its own cgroup is the mount root."""
    rel = path.lstrip("/")
    for candidate in (os.path.join(base, rel), base):
        if os.path.exists(os.path.join(candidate, probe)):
            return candidate
    return None


class Sampler:
    """Reads usage and limits; keeps the previous CPU sample for a rate."""

    def __init__(self, paths: CgroupPaths | None = None) -> None:
        self.paths = paths or CgroupPaths.discover()
        self._last: tuple[float, float] | None = None  # (wall s, cpu s)

    # memory ---------------------------------------------------------------------------
    def memory(self) -> tuple[float, float]:
        """(used bytes, limit bytes)."""
        host_total, host_avail = _host_memory()
        used: int | None = None
        limit: int | None = None
        if self.paths.v2:
            used = _int(os.path.join(self.paths.v2, "memory.current"))
            limit = _int(os.path.join(self.paths.v2, "memory.max"))
            inactive = _stat_field(os.path.join(self.paths.v2, "memory.stat"), "inactive_file")
        elif self.paths.memory:
            used = _int(os.path.join(self.paths.memory, "memory.usage_in_bytes"))
            limit = _int(os.path.join(self.paths.memory, "memory.limit_in_bytes"))
            inactive = _stat_field(
                os.path.join(self.paths.memory, "memory.stat"), "total_inactive_file"
            )
        else:
            inactive = None
        if limit is None or limit >= min(UNLIMITED, host_total):
            # Not limited: the sandbox can use the host's memory.
            return float(host_total - host_avail), float(host_total)
        if used is None:
            return float(host_total - host_avail), float(limit)
        if inactive:
            used = max(0, used - inactive)  # page cache that can be dropped is not "used"
        return float(used), float(limit)

    # cpu ------------------------------------------------------------------------------
    def cpu_count(self) -> float:
        host = float(
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        quota: int | None = None
        period: int | None = None
        if self.paths.v2:
            raw = _read(os.path.join(self.paths.v2, "cpu.max"))
            if raw:
                q, _, p = raw.partition(" ")
                if q != "max":
                    quota, period = int(q), int(p or 100000)
        elif self.paths.cpu:
            quota = _int(os.path.join(self.paths.cpu, "cpu.cfs_quota_us"))
            period = _int(os.path.join(self.paths.cpu, "cpu.cfs_period_us"))
        if quota and quota > 0 and period:
            return min(host, round(quota / period, 2))
        return host

    def cpu_seconds(self) -> float | None:
        if self.paths.v2:
            usec = _stat_field(os.path.join(self.paths.v2, "cpu.stat"), "usage_usec")
            return usec / 1e6 if usec is not None else None
        if self.paths.cpuacct:
            ns = _int(os.path.join(self.paths.cpuacct, "cpuacct.usage"))
            return ns / 1e9 if ns is not None else None
        return None

    def cpu_percent(self, cpus: float) -> float:
        now = time.monotonic()
        used = self.cpu_seconds()
        if used is None:
            used = _host_busy_seconds()
            cpus = float(os.cpu_count() or 1)
        previous, self._last = self._last, (now, used)
        if previous is None or now <= previous[0]:
            return 0.0
        pct = (used - previous[1]) / (now - previous[0]) / max(cpus, 0.01) * 100.0
        return round(max(0.0, min(100.0, pct)), 2)

    def sample(self) -> dict[str, float | int]:
        cpus = self.cpu_count()
        used, total = self.memory()
        return {
            "cpu_count": cpus,
            "cpu_used_pct": self.cpu_percent(cpus),
            "mem_total_mib": round(total / 1048576, 2),
            "mem_used_mib": round(used / 1048576, 2),
            "timestamp": sse.now_ms(),
        }


def _stat_field(path: str, key: str) -> int | None:
    raw = _read(path)
    if not raw:
        return None
    for line in raw.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _host_memory() -> tuple[int, int]:
    total = avail = 0
    for line in (_read("/proc/meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            total = int(rest.split()[0]) * 1024
        elif name == "MemAvailable":
            avail = int(rest.split()[0]) * 1024
    return total, avail


def _host_busy_seconds() -> float:
    line = (_read("/proc/stat") or "cpu 0").splitlines()[0].split()
    values = [int(v) for v in line[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0) if len(values) > 3 else 0
    return (sum(values) - idle) / (os.sysconf("SC_CLK_TCK") or 100)


class MetricsService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sampler: Sampler | None = None

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    def _sampler(self) -> Sampler:
        if self.sampler is None:
            self.sampler = Sampler()
            self.sampler.sample()  # prime the CPU baseline
        return self.sampler

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/metrics", self.get_route, methods=["GET"]),
            Route("/metrics/watch", self.watch_route, methods=["GET"]),
        ]

    async def get_route(self, request: Request) -> Response:
        sampler = self._sampler()
        if sampler._last is not None and time.monotonic() - sampler._last[0] < 0.05:
            await asyncio.sleep(0.1)  # a CPU rate needs some time between samples
        return JSON(sampler.sample())

    async def watch_route(self, request: Request) -> Response:
        sampler = Sampler(self._sampler().paths)
        sampler.sample()
        interval = self.settings.metrics_interval

        framing = sse.wants_sse(request)

        async def body() -> AsyncIterator[bytes]:
            await asyncio.sleep(min(interval, 0.2))
            while True:
                sample = sampler.sample()
                # The reference writes one JSON line per sample; SSE frames when asked.
                yield (sse.encode(sample, sse=True) if framing
                       else sse.encode_data(sample).encode() + b"\n")
                await asyncio.sleep(interval)

        return sse.sse_response(body(), keepalive_interval=None)
