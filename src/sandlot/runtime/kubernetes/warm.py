"""Warm Pods: sandboxes started ahead of time on the cluster, claimed by creates.

A warm Pod is a complete sandbox Pod (init container, execd, the image, limits) whose execd
runs with ``--pooled`` and a random pool token (in a Secret of the Pod's, like a sandbox's
token) and already answers ``/ping``. It is labelled ``sandlot.io/warm=true`` and named
``sandlot-warm-<hex>``, so it is never one of the runtime's sandboxes. A create whose pool,
image and Pod resources match a ready warm Pod claims it: the Pod is relabelled with the
sandbox id (labels are the only record: a restarted server finds it by them) and execd is
handed the sandbox's environment, token and entrypoint. Pod resources cannot change after
start on the clusters sandlot supports (in-place resize is 1.27+ and alpha), so a create of
another shape starts cold instead, with the same result.

One ``WarmKeeper`` per pool: one per image of the server's warm pool (``[runtime]
warm_pool_images``, ``[kubernetes] warm_pool_size``, the default shape), and one per
``/v1/pools`` pool (``extensions.poolRef``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from sandlot.runtime.base import SandboxSpec, WarmPoolStats
from sandlot.runtime.kubernetes.pod import LABEL_SANDBOX, LABEL_WARM

log = logging.getLogger(__name__)

WARM_ID_PREFIX = "warm-"
ANNOTATION_POOL = "sandlot.io/pool"  # the pool a warm Pod was made for ("" = server's)
# Consecutive failed warm starts after which a keeper waits for the next claim or resize.
MAX_FAILURES = 3


def new_warm_id() -> str:
    return WARM_ID_PREFIX + secrets.token_hex(6)


@dataclass(frozen=True)
class WarmPod:
    name: str  # the Pod's name
    token: str  # its execd's pool token
    ip: str | None


class WarmKeeper:
    """Keeps ``size`` warm Pods of ``template`` ready, starting ``parallel`` at a time.

    ``make(template)`` starts one (``template`` carries its warm id and pool token) and
    returns it once execd answers; ``discard(name)`` deletes one. Both are the runtime's.
    """

    def __init__(self, pool: str, template: SandboxSpec, size: int,
                 make: Callable[[SandboxSpec], Awaitable[WarmPod]],
                 discard: Callable[[str], Awaitable[None]], parallel: int = 2) -> None:
        self.pool = pool
        self.template = template
        self.size = max(0, size)
        self._make = make
        self._discard = discard
        self._parallel = max(1, parallel)
        self.ready: list[WarmPod] = []
        self.claims = 0
        self.misses = 0
        self._making = 0
        self._failures = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    def fits(self, spec: SandboxSpec, same_resources: Callable[[SandboxSpec, SandboxSpec],
                                                                  bool]) -> bool:
        """Could a warm Pod of this keeper serve ``spec`` exactly as a cold start would?"""
        return (spec.image.reference == self.template.image.reference
                and spec.image.auth is None and spec.snapshot_id is None
                and not spec.volumes and spec.network_policy is None
                and same_resources(spec, self.template))

    def take(self) -> WarmPod | None:
        """A ready warm Pod (the keeper refills after), or None (a miss)."""
        if self.ready:
            self.claims += 1
            pod = self.ready.pop(0)
            self.fill()
            return pod
        self.misses += 1
        self._failures = 0  # a create wants one: try again
        self.fill()
        return None

    def forget(self, name: str) -> None:
        """A ready warm Pod that stopped or vanished: no longer offered; start another."""
        before = len(self.ready)
        self.ready = [p for p in self.ready if p.name != name]
        if len(self.ready) != before:
            self.fill()

    def resize(self, size: int, template: SandboxSpec | None = None) -> None:
        self.size = max(0, size)
        if template is not None:
            self.template = template
        self._failures = 0
        while len(self.ready) > self.size:
            self._spawn(self._discard(self.ready.pop().name))
        self.fill()

    def fill(self) -> None:
        while (not self._stopped and self._failures < MAX_FAILURES
               and len(self.ready) + self._making < self.size
               and self._making < self._parallel):
            self._making += 1
            self._spawn(self._start_one())

    async def _start_one(self) -> None:
        warm_id = new_warm_id()
        template = replace(self.template, sandbox_id=warm_id,
                           execd_token=secrets.token_urlsafe(24))
        try:
            pod = await self._make(template)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the pool is an optimisation
            self._failures += 1
            log.warning("warm Pod %s of pool %r did not start (%s failures): %s", warm_id,
                        self.pool, self._failures, exc)
            return
        finally:
            self._making -= 1
        self._failures = 0
        if self._stopped or len(self.ready) >= self.size:
            await self._discard(pod.name)
            return
        self.ready.append(pod)
        self.fill()

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("warm pool %r work failed", self.pool, exc_info=task.exception())
        if not self._stopped:
            self.fill()

    def stats(self) -> WarmPoolStats:
        return WarmPoolStats(ready=len(self.ready), claims=self.claims, misses=self.misses)

    async def stop(self) -> list[str]:
        """Stop filling; the names of the ready warm Pods, for the caller to delete."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        names = [p.name for p in self.ready]
        self.ready.clear()
        return names


def warm_labels_patch(sandbox_id: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The patch that makes a warm Pod sandbox ``sandbox_id``'s (``None`` deletes a label)."""
    return {"metadata": {"labels": {LABEL_SANDBOX: sandbox_id, LABEL_WARM: None},
                         "annotations": annotations}}
