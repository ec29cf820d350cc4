"""Run one coroutine per item with at most N of them at once.

Start-up work (reconciling hundreds of records, removing a crashed server's warm containers)
is runc and store round trips: a few at a time overlap their waits, all at once would
thrash the machine a restart is meant to bring back quickly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def each_bounded(items: Iterable[T], work: Callable[[T], Awaitable[None]],
                       limit: int) -> list[tuple[T, BaseException]]:
    """``work`` on every item, ``limit`` at a time; every item runs whatever the others do.
    Returns the items that raised, with what they raised, in the items' order."""
    gate = asyncio.Semaphore(max(1, limit))
    ordered = list(items)

    async def one(item: T) -> None:
        async with gate:
            await work(item)

    results = await asyncio.gather(*(one(i) for i in ordered), return_exceptions=True)
    return [(item, res) for item, res in zip(ordered, results, strict=True)
            if isinstance(res, BaseException)]
