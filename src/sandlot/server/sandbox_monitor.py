"""SandboxMonitor: samples live sandboxes' cgroups (CPU, memory, OOM kills) every few seconds.

The samples feed ``/metrics`` and the console's charts (``latest``), and an OOM kill seen in
a sample becomes an ``OOMKilled`` event. The same loop forgets the events and logs of
sandboxes that ended longer ago than ``[diagnostics] retention_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandlot.runtime.base import ContainerState, ResourceUsage
from sandlot.server.event_recorder import WARNING, EventRecorder
from sandlot.server.models import SandboxState

# After an OOM kill, how long the monitor watches for the whole container having gone.
ALIVE_CHECKS = 20
ALIVE_CHECK_INTERVAL = 0.5

if TYPE_CHECKING:
    from sandlot.server.service import SandboxService

log = logging.getLogger(__name__)

_SAMPLED = (SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.PAUSING,
            SandboxState.RESUMING)
_PURGE_EVERY = 300.0  # seconds between retention sweeps


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    usage: ResourceUsage


class SandboxMonitor:
    def __init__(self, service: SandboxService, recorder: EventRecorder, interval: float,
                 retention: float) -> None:
        self.service = service
        self.recorder = recorder
        self.interval = interval
        self.retention = retention
        self._latest: dict[str, Sample] = {}
        self._oom_seen: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()
        self._baseline: set[str] = set()

    def latest(self, sandbox_id: str) -> Sample | None:
        """The last sample of a live sandbox (None before the first or after its end)."""
        return self._latest.get(sandbox_id)

    def samples(self) -> dict[str, Sample]:
        return dict(self._latest)

    async def sample(self, sandbox_id: str) -> Sample | None:
        """Sample one sandbox now (also records an OOM kill seen since the last sample)."""
        try:
            usage = await self.service.runtime.usage(sandbox_id)
        except Exception:  # noqa: BLE001 - a sandbox going away while sampled
            usage = None
        return self._record(sandbox_id, usage)

    def _record(self, sandbox_id: str, usage: ResourceUsage | None) -> Sample | None:
        """Keep ``usage`` as the sandbox's latest sample; an OOM kill counted since the last
        one becomes an event."""
        if usage is None:
            return None
        found = Sample(time.time(), usage)
        self._latest[sandbox_id] = found
        if sandbox_id in self._baseline:
            self._baseline.discard(sandbox_id)
            self._oom_seen[sandbox_id] = usage.oom_kills
        seen = self._oom_seen.get(sandbox_id, 0)
        if usage.oom_kills > seen:
            self._oom_seen[sandbox_id] = usage.oom_kills
            limit = (f"{usage.memory_limit_bytes / (1 << 20):.0f} MiB"
                     if usage.memory_limit_bytes else "none")
            self.recorder.record(
                sandbox_id, "OOMKilled",
                f"The kernel killed {usage.oom_kills - seen} process(es) in the sandbox for "
                f"exceeding its memory limit ({limit}; OOM kills so far: {usage.oom_kills})",
                WARNING)
            task = asyncio.get_running_loop().create_task(self._check_alive(sandbox_id))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)
        return found

    async def _check_alive(self, sandbox_id: str) -> None:
        """After an OOM kill: did it take the whole container (e.g. gVisor's sentry, one host
        process)? Backends that do not watch their containers report it only this way.
        Asked again for a while: gVisor 2024's runsc reports a killed sentry running until
        it has finished exiting (1-2 s, more on a loaded host)."""
        for _ in range(ALIVE_CHECKS):
            try:
                info = await self.service.runtime.inspect(sandbox_id)
            except Exception:  # noqa: BLE001 - gone meanwhile
                return
            if info.state in (ContainerState.STOPPED, ContainerState.MISSING):
                if info.reason is None:
                    info.reason = "OOMKilled"
                await self.service.container_changed(sandbox_id, info)
                return
            await asyncio.sleep(ALIVE_CHECK_INTERVAL)

    def take_baseline(self, sandbox_id: str) -> None:
        """The next sample's OOM-kill count is old news (e.g. after a server restart)."""
        self._baseline.add(sandbox_id)

    def forget(self, sandbox_id: str) -> None:
        self._latest.pop(sandbox_id, None)
        self._oom_seen.pop(sandbox_id, None)
        self._baseline.discard(sandbox_id)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._reports):  # e.g. an after-OOM watch still asking
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        last_purge = 0.0
        while True:
            if time.monotonic() - last_purge >= _PURGE_EVERY:
                last_purge = time.monotonic()
                await self._purge()
            if self.interval > 0:
                await self._sample_all()
            await asyncio.sleep(self.interval if self.interval > 0 else _PURGE_EVERY)

    async def _sample_all(self) -> None:
        """Every live sandbox, read together (``Runtime.usage_many``)."""
        live = {r.id for r in self.service.records() if r.state in _SAMPLED}
        for gone in set(self._latest) - live:
            self.forget(gone)
        if not live:
            return
        try:
            usages = await self.service.runtime.usage_many(sorted(live))
        except Exception:  # noqa: BLE001 - tried again at the next tick
            log.warning("sampling the sandboxes' usage failed", exc_info=True)
            return
        for sandbox_id, usage in usages.items():
            # A sandbox that ended while the batch was read is not sampled back to life.
            rec = self.service.record(sandbox_id)
            if rec is not None and rec.state in _SAMPLED:
                self._record(sandbox_id, usage)

    async def _purge(self) -> None:
        keep = {r.id for r in self.service.records()}
        try:
            await self.recorder.store.purge(time.time() - self.retention, keep)
        except Exception:  # noqa: BLE001 - tried again at the next sweep
            log.warning("purging old diagnostic events failed", exc_info=True)
