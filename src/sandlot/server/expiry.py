"""Expiry timers: one loop timer per sandbox, rebuilt from the store at start-up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from sandlot.server.models import utcnow

log = logging.getLogger(__name__)


class ExpiryScheduler:
    """Calls ``on_expire(sandbox_id)`` once a sandbox's ``expiresAt`` has passed."""

    # Timers further out than this are re-armed in steps, so a wall-clock jump cannot push
    # an expiry days late (loop timers run on the monotonic clock).
    _MAX_STEP = 3600.0

    def __init__(self, on_expire: Callable[[str], Awaitable[None]]):
        self._on_expire = on_expire
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._deadlines: dict[str, datetime] = {}
        self._running: set[asyncio.Task[None]] = set()

    def schedule(self, sandbox_id: str, expires_at: datetime | None) -> None:
        self.cancel(sandbox_id)
        if expires_at is None:
            return
        self._deadlines[sandbox_id] = expires_at
        self._arm(sandbox_id)

    def _arm(self, sandbox_id: str) -> None:
        delay = (self._deadlines[sandbox_id] - utcnow()).total_seconds()
        loop = asyncio.get_running_loop()
        self._timers[sandbox_id] = loop.call_later(
            max(0.0, min(delay, self._MAX_STEP)), self._fire, sandbox_id
        )

    def _fire(self, sandbox_id: str) -> None:
        self._timers.pop(sandbox_id, None)
        deadline = self._deadlines.get(sandbox_id)
        if deadline is None:
            return
        if (deadline - utcnow()).total_seconds() > 0.001:
            self._arm(sandbox_id)
            return
        self._deadlines.pop(sandbox_id, None)
        task = asyncio.get_running_loop().create_task(self._expire(sandbox_id))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _expire(self, sandbox_id: str) -> None:
        try:
            await self._on_expire(sandbox_id)
        except Exception:
            log.exception("expiring sandbox %s failed", sandbox_id)

    def cancel(self, sandbox_id: str) -> None:
        timer = self._timers.pop(sandbox_id, None)
        if timer is not None:
            timer.cancel()
        self._deadlines.pop(sandbox_id, None)

    def pending(self) -> dict[str, datetime]:
        return dict(self._deadlines)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._deadlines.clear()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
