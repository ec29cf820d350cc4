"""A run's events handed from the kernel's callbacks to the response in batches.

Events that arrive together (a cell's count, result and completion often do) go out as one
write: each write to the client is a socket send and a wake-up on both sides, which the
py-spy profile of warm ``1+1`` runs showed as the largest single cost in execd. Waiting is a
plain future with a timer for the keep-alive (no task per event or per wait).

A run's first batch (its ``init`` event) can be held back until the kernel has been sent
the code (``hold``/``release``): the response's head and ``init`` then leave while the
kernel already runs the cell, instead of before it is asked to (a socket write, and the
client's and relay's wake-up, taken off the critical path of a short cell).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Batches(Generic[T]):
    """``put`` items (``None`` ends the run) from anywhere on the loop; ``batches`` yields
    what has arrived since the last batch, or ``[]`` after ``keepalive`` s of silence."""

    def __init__(self) -> None:
        self._items: list[T | None] = []
        self._waiter: asyncio.Future[None] | None = None
        self._held = False

    def hold(self) -> None:
        """Yield nothing (items accumulate) until ``release`` or the end (``None``)."""
        self._held = True

    def release(self) -> None:
        """Let what has accumulated out (idempotent)."""
        self._held = False
        if self._items:
            self._wake()

    def _ready(self) -> bool:
        return bool(self._items) and (not self._held or None in self._items)

    def put(self, item: T | None) -> None:
        self._items.append(item)
        if self._ready():
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def batches(self, keepalive: float | None = None) -> AsyncIterator[list[T]]:
        loop = asyncio.get_running_loop()
        while True:
            if not self._ready():
                self._waiter = loop.create_future()
                timer = loop.call_later(keepalive, self._wake) if keepalive else None
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                    if timer is not None:
                        timer.cancel()
            if not self._ready():  # the keep-alive timer while held (or nothing yet)
                yield []
                continue
            taken, self._items = self._items, []
            if None in taken:
                last = [item for item in taken[:taken.index(None)] if item is not None]
                if last:
                    yield last
                return
            yield [item for item in taken if item is not None]
