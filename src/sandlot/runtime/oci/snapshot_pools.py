"""Automatic warm pools of snapshots that sandboxes are created from.

A create from a snapshot cannot use the server-wide warm pool (its containers stand on an
image's layers, not the snapshot's), so it was always a cold start. Here the first create
from a snapshot starts a small warm pool of it (``size`` containers, the same ``WarmPool``
the image pool uses), and the creates after it are claims. Memory is bounded: at most
``max_pools`` snapshots are kept warm (the least recently used one is drained to make room
for another), and a pool nobody took from for ``idle_seconds`` is drained. Deleting a
snapshot drains its pool first (``draining``), and no pool of it starts meanwhile.

The runtime supplies ``make``/``discard`` (its warm-container start and removal); both
runtimes (oci, docker) use this class with their own image objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandlot.images.model import Image
from sandlot.runtime.admission import StartGate
from sandlot.runtime.base import WarmPoolStats
from sandlot.runtime.oci.pool import Warm, WarmPool

log = logging.getLogger(__name__)
NAME_PREFIX = "snapshot/"  # how the pools are named in warm_pools() (metrics)


@dataclass
class _Kept:
    pool: WarmPool
    last_used: float


class SnapshotPools:
    """Per-snapshot warm pools, bounded in number and idle time (see module docstring)."""

    def __init__(
        self,
        size: int,
        max_pools: int,
        idle_seconds: float,
        make: Callable[[Image], Awaitable[Warm]],
        discard: Callable[[str], Awaitable[None]],
        parallel: int = 1,
        clock: Callable[[], float] = time.monotonic,
        gate: StartGate | None = None,
    ) -> None:
        self.size = max(0, size)
        self.max_pools = max(0, max_pools)
        self.idle_seconds = idle_seconds
        self._make = make
        self._discard = discard
        self._parallel = parallel
        self._clock = clock
        self._gate = gate
        self._kept: dict[str, _Kept] = {}
        self._blocked: set[str] = set()  # snapshots being deleted: no pool starts
        self._bg: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.size > 0 and self.max_pools > 0

    async def claim(self, snapshot_id: str, image: Image) -> Warm | None:
        """A warm container of the snapshot: a ready one, or, when none is but the pool is
        starting one that no other create waits for, that one (``WarmPool.claim``) rather
        than a container started beside it. A miss starts (or re-points) the snapshot's
        pool, so the next create from it is a claim. Safe against the snapshot's delete:
        the create marked its use before (the delete is refused while a use is marked)."""
        kept = self._kept_for(snapshot_id, image)
        if kept is None:
            return None
        warm = await kept.pool.claim(image)  # a claim refills after it
        if warm is None:
            kept.pool.prewarm(image)  # fills; a no-op while it is filling already
        return warm

    def _kept_for(self, snapshot_id: str, image: Image) -> _Kept | None:
        """The snapshot's pool, started now if it has none; None when pools are off or
        the snapshot is being deleted."""
        if not self.enabled or snapshot_id in self._blocked:
            return None
        kept = self._kept.get(snapshot_id)
        if kept is None:
            self._make_room()
            kept = self._kept[snapshot_id] = _Kept(
                WarmPool(self.size, [image.name], self._make, self._discard,
                         parallel=self._parallel, gate=self._gate), self._clock())
            self._start_reaper()
        kept.last_used = self._clock()
        return kept

    def _make_room(self) -> None:
        while len(self._kept) >= self.max_pools:
            oldest = min(self._kept, key=lambda sid: self._kept[sid].last_used)
            log.info("snapshot pools: draining %s to make room (at most %d kept)", oldest,
                     self.max_pools)
            self._spawn(self._stop(oldest, self._kept.pop(oldest)))

    async def _drain(self, snapshot_id: str) -> None:
        kept = self._kept.pop(snapshot_id, None)
        if kept is not None:
            await self._stop(snapshot_id, kept)

    async def _stop(self, snapshot_id: str, kept: _Kept) -> None:
        for cid in await kept.pool.stop():
            try:
                await self._discard(cid)
            except Exception:  # noqa: BLE001 - the next start's sweep removes it
                log.warning("cannot remove warm container %s of snapshot %s", cid,
                            snapshot_id, exc_info=True)

    @contextlib.asynccontextmanager
    async def draining(self, snapshot_id: str) -> AsyncIterator[None]:
        """Drain the snapshot's pool and keep it from starting again inside the block
        (a snapshot's delete: its layer must not be in use by warm containers)."""
        self._blocked.add(snapshot_id)
        try:
            await self._drain(snapshot_id)
            yield
        finally:
            self._blocked.discard(snapshot_id)

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        """Drain pools idle for ``idle_seconds``; ends when none is kept."""
        period = max(0.05, min(self.idle_seconds / 4, 30.0))
        while self._kept:
            await asyncio.sleep(period)
            now = self._clock()
            for sid in [s for s, k in self._kept.items()
                        if now - k.last_used >= self.idle_seconds]:
                log.info("snapshot pools: %s idle for %.0f s, draining it", sid,
                         self.idle_seconds)
                await self._drain(sid)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def kept(self) -> list[str]:
        return sorted(self._kept)

    def ready_count(self, snapshot_id: str) -> int:
        kept = self._kept.get(snapshot_id)
        return sum(kept.pool.ready_count(n) for n in kept.pool.names) if kept else 0

    async def wait_full(self, snapshot_id: str, timeout: float = 60.0) -> None:
        """Until the snapshot's pool is full (tests, measurements)."""
        kept = self._kept.get(snapshot_id)
        if kept is not None:
            for name in kept.pool.names:
                await kept.pool.wait_full(name, timeout)

    def stats(self) -> dict[str, WarmPoolStats]:
        return {NAME_PREFIX + sid: k.pool.stats() for sid, k in self._kept.items()}

    async def stop(self) -> None:
        """Drain every pool (a server stop); the warm containers are removed."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(BaseException):
                await self._reaper
        for task in list(self._bg):
            with contextlib.suppress(BaseException):
                await task
        for sid in list(self._kept):
            await self._drain(sid)
