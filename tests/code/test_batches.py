"""``code.batches.Batches``: events that arrive together leave together, a quiet spell gives
an empty batch (the stream's keep-alive), ``None`` ends the run."""

from __future__ import annotations

import asyncio

from sandlot.execd.code.batches import Batches


async def _collect(b: Batches[str], keepalive: float | None) -> list[list[str]]:
    return [batch async for batch in b.batches(keepalive)]


def test_items_put_together_come_out_in_one_batch_and_none_ends() -> None:
    async def scenario() -> list[list[str]]:
        b: Batches[str] = Batches()
        reader = asyncio.ensure_future(_collect(b, None))
        b.put("init")
        await asyncio.sleep(0.01)
        for item in ("count", "result", "complete", None, "after the end"):
            b.put(item)
        return await asyncio.wait_for(reader, 5)

    assert asyncio.run(scenario()) == [["init"], ["count", "result", "complete"]]


def test_a_quiet_spell_yields_an_empty_batch_per_keepalive() -> None:
    async def scenario() -> list[list[str]]:
        b: Batches[str] = Batches()
        reader = asyncio.ensure_future(_collect(b, 0.05))
        await asyncio.sleep(0.18)
        b.put("late")
        b.put(None)
        return await asyncio.wait_for(reader, 5)

    got = asyncio.run(scenario())
    assert got[-1] == ["late"]
    assert len(got) >= 2 and all(batch == [] for batch in got[:-1])


def test_an_end_with_nothing_before_it_yields_nothing() -> None:
    async def scenario() -> list[list[str]]:
        b: Batches[str] = Batches()
        b.put(None)
        return await _collect(b, 0.05)

    assert asyncio.run(scenario()) == []


def test_a_held_first_batch_leaves_on_release_or_at_the_end() -> None:
    async def scenario(release: bool) -> list[list[str]]:
        b: Batches[str] = Batches()
        b.put("init")
        b.hold()
        reader = asyncio.ensure_future(_collect(b, None))
        await asyncio.sleep(0.02)
        assert not reader.done()
        if release:
            b.release()
            await asyncio.sleep(0.01)
        b.put("complete")
        b.put(None)
        return await asyncio.wait_for(reader, 5)

    assert asyncio.run(scenario(True)) == [["init"], ["complete"]]
    assert asyncio.run(scenario(False)) == [["init", "complete"]]


def test_a_held_batch_still_gets_its_keepalive() -> None:
    async def scenario() -> list[list[str]]:
        b: Batches[str] = Batches()
        b.put("init")
        b.hold()
        reader = asyncio.ensure_future(_collect(b, 0.05))
        await asyncio.sleep(0.08)
        b.release()
        b.put(None)
        return await asyncio.wait_for(reader, 5)

    got = asyncio.run(scenario())
    assert got[-1] == ["init"] and got[0] == []
