"""Admission control for container starts: a burst queues instead of thrashing.

A cold start (``runc run`` and execd's start-up until ``/ping`` answers) is CPU work: fifty
of them at once on two cores all finish late together, while the same fifty let through a few
at a time finish one after another, each as fast as on an idle machine (the burst's median
halves; its last start ends no later). ``StartGate`` lets ``slots`` starts run at once and
queues the rest first come, first served (``[runtime] max_concurrent_starts``, default two
per CPU). Starts for requests go before background ones
(warm-pool refills): a refill only gets a slot when no request is waiting, so the pool fills
at the rate the machine sustains and never delays a create it exists to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator

from sandlot.runtime import execd_client

# How long a cold create holds its start slot waiting for execd's first /ping.
STARTED_WAIT = 30.0


def default_slots(per_cpu: int = 2) -> int:
    """``per_cpu`` starts per CPU the server may use: a start is mostly, not only, CPU work
    (it also waits on runc, the disk and the server), so one per CPU would leave cores idle.

    Measured on the shared 2-core VM (50 concurrent creates, warm pool 10, load average
    15-28 from other work): p50 27.8 s with no gate, 13.4 s with 2 slots, 10.5 s with 4.
    With execd forked from the zygote a start is mostly waiting (runc, the zygote's
    launches one after another, execd's first answer), so the oci runtime lets through
    4 per CPU then (ZYGOTE_SLOTS_PER_CPU, docs/runtime.md).
    """
    return per_cpu * max(1, len(os.sched_getaffinity(0)))


# Start slots per CPU when execd is forked from the zygote (measured, 24 cold creates at
# once on the shared 2-core VM, load 9-12: wall 4.5 s with 4 slots, 1.8-2.2 s with 8,
# 5.6 s with 16, where the zygote's one-at-a-time launches became the queue).
ZYGOTE_SLOTS_PER_CPU = 4


class StartGate:
    """At most ``slots`` starts at once; waiting requests before waiting background work."""

    def __init__(self, slots: int = 0, per_cpu: int = 2) -> None:
        self.slots = slots if slots > 0 else default_slots(per_cpu)
        self.running = 0
        self._requests: deque[asyncio.Future[None]] = deque()
        self._background: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._requests) + len(self._background)

    @contextlib.asynccontextmanager
    async def slot(self, *, background: bool = False) -> AsyncIterator[None]:
        """Hold one start slot for the body (a request's, or a background one's)."""
        await self._acquire(background)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, background: bool) -> None:
        queue = self._background if background else self._requests
        if self.running < self.slots and not self._requests and not (background and queue):
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await waiter  # _release hands its slot over (running stays counted)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # _release may have dropped it already
                    queue.remove(waiter)
            raise

    def _release(self) -> None:
        for queue in (self._requests, self._background):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot goes straight to the next waiter
                    return
        self.running -= 1


async def started(connect: execd_client.Connect, token: str | None) -> bool:
    """Wait, still holding the start slot, until a new sandbox's execd answers ``/ping``
    (True: its start-up is most of a start's CPU), or give up (False: the server's own wait
    then decides, with its longer timeout and its error)."""
    try:
        await execd_client.wait_ready(connect, token, STARTED_WAIT)
    except Exception:  # noqa: BLE001 - e.g. deleted meanwhile: the server's wait reports it
        return False
    return True
