"""Admission control for container starts: a burst queues instead of thrashing.

A cold start (``runc run`` and execd's start-up until ``/ping`` answers) is CPU work: fifty
of them at once on two cores all finish late together, while the same fifty let through a few
at a time finish one after another, each as fast as on an idle machine (the burst's median
halves; its last start ends no later). ``StartGate`` lets ``slots`` starts run at once and
queues the rest first come, first served (``[runtime] max_concurrent_starts``, default two
per CPU). Starts for requests go before background ones
(warm-pool refills): a refill only gets a slot when no request's start is waiting or running,
so the pool fills at the rate the machine has to spare and never delays a create it exists
to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from sandlot.runtime import execd_client
from sandlot.runtime.base import ContainerInfo, ContainerState

# How long a cold create holds its start slot waiting for execd's first /ping.
STARTED_WAIT = 30.0
ENDED_CHECK_EVERY = 2.0


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


# A refill waits while creates start (see StartGate); after this long it may start beside
# them (as long as none is queued), so a steady trickle of creates cannot starve the pool.
BACKGROUND_PATIENCE = 5.0


class _Waiter:
    def __init__(self, future: asyncio.Future[None], background: bool) -> None:
        self.future = future
        self.background = background
        self.impatient = False  # a background waiter past BACKGROUND_PATIENCE


class StartGate:
    """At most ``slots`` starts at once; waiting requests before waiting background work.

    A background start (a warm-pool refill) begins only while no request's start is queued
    or running: a burst's last creates do not share the machine with the refills their own
    claims set off (measured: in a 50-create burst four refills began during the last
    ~1.3 s and ran beside its last eight creates). A refill that has waited
    ``BACKGROUND_PATIENCE`` seconds may start beside running creates, never before a
    queued one.
    """

    def __init__(self, slots: int = 0, per_cpu: int = 2) -> None:
        self.slots = slots if slots > 0 else default_slots(per_cpu)
        self.running = 0
        self.running_requests = 0
        self._requests: deque[_Waiter] = deque()
        self._background: deque[_Waiter] = deque()

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
            self._release(background)

    def _may_start(self, background: bool, impatient: bool = False) -> bool:
        if self.running >= self.slots or self._requests:
            return False
        return not background or self.running_requests == 0 or impatient

    def _grant(self, background: bool) -> None:
        self.running += 1
        if not background:
            self.running_requests += 1

    async def _acquire(self, background: bool) -> None:
        queue = self._background if background else self._requests
        if not queue and self._may_start(background):
            self._grant(background)
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), background)
        queue.append(waiter)
        timer = (loop.call_later(BACKGROUND_PATIENCE, self._lose_patience, waiter)
                 if background else None)
        try:
            await waiter.future  # _dispatch counts the slot as granted before waking us
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release(background)  # granted a slot as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # _dispatch may have dropped it already
                    queue.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _lose_patience(self, waiter: _Waiter) -> None:
        waiter.impatient = True
        self._dispatch()

    def _release(self, background: bool) -> None:
        self.running -= 1
        if not background:
            self.running_requests -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiters: requests first, in order; then background ones."""
        while self._requests and self.running < self.slots:
            waiter = self._requests.popleft()
            if not waiter.future.done():
                self._grant(False)
                waiter.future.set_result(None)
        while self._background:
            waiter = self._background[0]
            if waiter.future.done():
                self._background.popleft()
                continue
            if not self._may_start(True, waiter.impatient):
                return
            self._background.popleft()
            self._grant(True)
            waiter.future.set_result(None)


async def started(connect: execd_client.Connect, token: str | None,
                  ended: execd_client.Ended | None = None) -> bool:
    """Wait, still holding the start slot, until a new sandbox's execd answers ``/ping``
    (True: its start-up is most of a start's CPU), or give up (False: the server's own wait
    then decides, with its longer timeout and its error). ``ended`` stops the wait early
    when the sandbox stopped meanwhile (asked every ENDED_CHECK_EVERY seconds only: it may
    run a ``runc state``)."""
    try:
        await execd_client.wait_ready(connect, token, STARTED_WAIT, ended=ended,
                                      check_every=ENDED_CHECK_EVERY)
    except Exception:  # noqa: BLE001 - e.g. deleted meanwhile: the server's wait reports it
        return False
    return True


def container_ended(inspect: Callable[[str], Awaitable[ContainerInfo]],
                    sandbox_id: str) -> execd_client.Ended:
    """An ``ended`` check for ``wait_ready``: why the sandbox's container is gone, or None."""

    async def ended() -> str | None:
        try:
            info = await inspect(sandbox_id)
        except Exception:  # noqa: BLE001 - not known now: keep waiting, the timeout bounds it
            return None
        if info.state == ContainerState.STOPPED:
            code = f" with code {info.exit_code}" if info.exit_code is not None else ""
            return f"the sandbox's container stopped{code}"
        if info.state == ContainerState.MISSING:
            return "the sandbox's container is gone"
        return None

    return ended
