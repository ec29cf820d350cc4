"""``each_bounded``: at most N at once, every item runs, failures come back in order."""

from __future__ import annotations

import asyncio

from sandlot.bounded import each_bounded


def test_limit_is_held_and_every_item_runs_despite_failures() -> None:
    running = 0
    peak = 0
    done: list[int] = []

    async def work(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        if i % 3 == 0:
            raise ValueError(i)
        done.append(i)

    failed = asyncio.run(each_bounded(range(10), work, 3))
    assert peak == 3
    assert sorted(done) == [1, 2, 4, 5, 7, 8]
    assert [item for item, _ in failed] == [0, 3, 6, 9]
    assert all(isinstance(exc, ValueError) for _, exc in failed)


def test_a_limit_below_one_still_runs_one_at_a_time() -> None:
    order: list[int] = []

    async def work(i: int) -> None:
        order.append(i)
        await asyncio.sleep(0)

    assert asyncio.run(each_bounded([2, 1], work, 0)) == []
    assert order == [2, 1]
