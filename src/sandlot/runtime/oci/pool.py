"""The warm pool: sandboxes started ahead of time, handed to ``create`` in a few ms.

A warm container is a complete sandbox (bundle, overlay, netns, cgroups) whose execd runs
with ``--pooled`` and a random pool token and already answers ``/ping``; it has no limits
but the runtime's pids cap and no entrypoint. Its id is ``_pool-<hex>``: a name no sandbox
can have (sandbox ids start with a letter or digit), so pool containers are never reported
as sandboxes. Claiming one maps the sandbox id to it (a file under ``data_dir/pool/claims``,
so the mapping survives a restart); the container keeps its id, paths and netns.

This module holds the pool's bookkeeping and its on-disk claims; ``OciRuntime`` does the
container work (and the claim call, through ``execd_client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.images.model import Image
from sandlot.runtime.admission import StartGate
from sandlot.runtime.base import WarmPoolStats

log = logging.getLogger(__name__)

POOL_PREFIX = "_pool-"
REFILL_DELAY = 0.25  # seconds between a claim and the refill it triggers
# How long a create that found no ready container waits for one already being started
# (``claim``) before it starts its own: a stalled warm start must not hold creates long.
CLAIM_PATIENCE = 2.0
READY_TIMEOUT = 30.0
# Consecutive failed warm creates after which a fill gives up until the next prewarm/claim.
MAX_FAILURES = 3


def is_pool_id(container_id: str) -> bool:
    return container_id.startswith(POOL_PREFIX)


def new_pool_id() -> str:
    return POOL_PREFIX + secrets.token_hex(8)


@dataclass(frozen=True)
class Warm:
    """A warm container ready to be claimed."""

    container_id: str
    token: str
    image_id: str


class ClaimStore:
    """sandbox id -> container id for claimed warm containers, one file per claim."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._map: dict[str, str] = {}
        for f in root.iterdir():
            if f.name.startswith("."):
                f.unlink(missing_ok=True)  # a write interrupted by a crash
                continue
            with contextlib.suppress(OSError):
                self._map[f.name] = f.read_text().strip()

    def get(self, sandbox_id: str) -> str | None:
        return self._map.get(sandbox_id)

    def items(self) -> dict[str, str]:
        return dict(self._map)

    def add(self, sandbox_id: str, container_id: str) -> None:
        tmp = self.root / f".{sandbox_id}.tmp"
        tmp.write_text(container_id)
        os.replace(tmp, self.root / sandbox_id)
        self._map[sandbox_id] = container_id

    def remove(self, sandbox_id: str) -> None:
        (self.root / sandbox_id).unlink(missing_ok=True)
        self._map.pop(sandbox_id, None)


class WarmPool:
    """Ready warm containers per image name, refilled in the background, ``parallel`` creates
    at a time.

    ``make(image)`` builds one warm container and returns it once its execd answers;
    ``discard(container_id)`` deletes one. Both are the runtime's. With a ``gate`` each make
    runs in one of its background start slots (after every waiting request's start), and the
    pool knows which makes are under way: ``claim`` waits for one of those rather than have
    a create start a container of its own beside them.
    """

    def __init__(
        self,
        size: int,
        images: list[str],
        make: Callable[[Image], Awaitable[Warm]],
        discard: Callable[[str], Awaitable[None]],
        parallel: int = 1,
        gate: StartGate | None = None,
    ) -> None:
        self.size = max(0, size)
        self.names = set(images)
        self._make = make
        self._discard = discard
        self._gate = gate
        self._started: dict[str, int] = {}  # makes of each image holding a start slot
        self._awaited: dict[str, int] = {}  # claims of each image waiting for one of those
        self._images: dict[str, Image] = {}
        self._ready: dict[str, list[Warm]] = {}
        self.claims = 0  # creates served from the pool
        self.misses = 0  # creates of a pooled image that found no ready container
        self._parallel = max(1, parallel)
        self._fills: dict[str, list[asyncio.Task[None]]] = {}
        self._making: dict[str, int] = {}  # warm containers of each image being started
        self._creates = asyncio.Semaphore(self._parallel)
        self._changed = asyncio.Condition()
        self._bg: set[asyncio.Task[Any]] = set()
        self._stopped = False  # a refill scheduled before stop() must not start after it

    def wants(self, image: Image) -> bool:
        return self.size > 0 and image.name in self.names

    def prewarm(self, image: Image) -> None:
        """Keep ``size`` warm containers of ``image`` (a no-op for images not pooled)."""
        if not self.wants(image):
            return
        old = self._images.get(image.name)
        self._images[image.name] = image
        if old is not None and old.id != image.id:  # the name now points at another image
            for w in self._ready.pop(image.name, []):
                self.spawn(self._discard(w.container_id))
        self._kick(image.name)

    def resize(self, size: int) -> None:
        """Keep ``size`` ready containers per image from now on. Ready ones beyond it are
        deleted: they would idle on the host unused (at 0 the pool serves none, and a
        named pool's ``bufferMax`` or ``poolMax`` room can fall to 0), as a Kubernetes
        pool's surplus Pods are."""
        self.size = max(0, size)
        for ready in self._ready.values():
            while len(ready) > self.size:
                self.spawn(self._discard(ready.pop().container_id))
        for name in self._images:
            self._kick(name)

    def take(self, image: Image) -> Warm | None:
        """A ready warm container of exactly this image, if any; the pool refills after."""
        if not self.wants(image):
            return None
        return self._counted(image, self._take_ready(image))

    async def claim(self, image: Image, patience: float = CLAIM_PATIENCE) -> Warm | None:
        """``take``; when none is ready but one is being started that no earlier claim waits
        for, wait up to ``patience`` seconds for it.

        A create that started a container of its own there would share the CPU with the
        pool's starts under way (measured: serial creates as fast as they come, pool of 10
        drained, 4 refills at once on 2 cores: every fifth or sixth create took 130-170 ms
        against ~60 for a cold start alone); the start under way is also further along."""
        if not self.wants(image):
            return None
        warm = self._take_ready(image)
        name = image.name
        if warm is None and self._started.get(name, 0) > self._awaited.get(name, 0):
            self._awaited[name] = self._awaited.get(name, 0) + 1
            try:
                async with asyncio.timeout(patience), self._changed:
                    await self._changed.wait_for(
                        lambda: self._has_ready(image) or not self._started.get(name, 0))
            except TimeoutError:
                pass
            finally:
                self._awaited[name] -= 1
            warm = self._take_ready(image)
        return self._counted(image, warm)

    def _has_ready(self, image: Image) -> bool:
        return any(w.image_id == image.id for w in self._ready.get(image.name, []))

    def _take_ready(self, image: Image) -> Warm | None:
        ready = self._ready.get(image.name, [])
        for i, w in enumerate(ready):
            if w.image_id == image.id:
                del ready[i]
                return w
        return None

    def _counted(self, image: Image, warm: Warm | None) -> Warm | None:
        """Count a claim (refilled soon) or a miss (refilled at once)."""
        if warm is not None:
            self.claims += 1
            self._kick_soon(image.name)
            return warm
        self.misses += 1
        if image.name in self._images:
            self._kick(image.name)
        return None

    def stats(self) -> WarmPoolStats:
        """Ready containers now, and claims/misses so far (``/metrics``)."""
        ready = sum(len(ws) for ws in self._ready.values())
        return WarmPoolStats(ready=ready, claims=self.claims, misses=self.misses)

    def ready_count(self, name: str) -> int:
        return len(self._ready.get(name, []))

    def container_ids(self) -> set[str]:
        return {w.container_id for ws in self._ready.values() for w in ws}

    async def wait_full(self, name: str, timeout: float = 60.0) -> None:
        """Until ``size`` containers of image ``name`` are ready (tests, measurements)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.ready_count(name) >= self.size)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _kick_soon(self, name: str) -> None:
        """Refill a moment after a claim, not during it: starting a container forks this
        (large) process and runs runc, which would slow the claim and its first requests."""
        asyncio.get_running_loop().call_later(REFILL_DELAY, self._kick, name)

    def _kick(self, name: str) -> None:
        """Run up to ``parallel`` fill workers for ``name`` (a refill is mostly waiting)."""
        if self._stopped:
            return
        tasks = [t for t in self._fills.get(name, []) if not t.done()]
        loop = asyncio.get_running_loop()
        while len(tasks) < self._parallel:
            tasks.append(loop.create_task(self._fill(name)))
        self._fills[name] = tasks

    async def _fill(self, name: str) -> None:
        failures = 0
        while (self.ready_count(name) + self._making.get(name, 0) < self.size
               and failures < MAX_FAILURES):
            image = self._images[name]
            self._making[name] = self._making.get(name, 0) + 1
            try:
                async with self._creates:
                    warm = await self._make_started(image)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the pool is an optimisation: log, retry, give up
                failures += 1
                log.warning("warm container for %s failed (%d/%d)", name, failures,
                            MAX_FAILURES, exc_info=True)
                await asyncio.sleep(0.5 * failures)
                continue
            finally:
                self._making[name] -= 1
            failures = 0
            # re-pointed or shrunk while we built it
            if self._images.get(name) is not image or self.ready_count(name) >= self.size:
                await self._discard(warm.container_id)
                continue
            self._ready.setdefault(name, []).append(warm)
            async with self._changed:
                self._changed.notify_all()

    async def _make_started(self, image: Image) -> Warm:
        """One make, in a background start slot of the gate (if any), counted as under way
        while it holds the slot. From the count's end to ``_fill`` putting the container
        among the ready nothing suspends, so a waiting claim never finds the make in neither
        place; waiting claims look again after every make (one that failed or was discarded
        frees them)."""
        if self._gate is None:
            return await self._make_uninterrupted(image)
        name = image.name
        async with self._gate.slot(background=True):  # after every waiting request's start
            self._started[name] = self._started.get(name, 0) + 1
            try:
                return await self._make_uninterrupted(image)
            finally:
                self._started[name] -= 1
                self.spawn(self._notify())  # runs after this step: after ``_fill``'s append

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _make_uninterrupted(self, image: Image) -> Warm:
        """Create one warm container; a cancel waits for it to finish, then removes it.

        Cancelling a create half-way (e.g. during ``runc run``) would let the container come
        up after its clean-up ran, leaving processes, mounts and cgroups behind.
        """
        making = asyncio.ensure_future(self._make(image))
        try:
            return await asyncio.shield(making)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                warm = await making
                await self._discard(warm.container_id)
            raise

    async def stop(self) -> list[str]:
        """Stop filling; returns the ready containers' ids (the caller deletes or keeps them)."""
        self._stopped = True
        tasks = [*(t for ts in self._fills.values() for t in ts), *self._bg]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        ids = sorted(self.container_ids())
        self._ready.clear()
        self._fills.clear()
        return ids
