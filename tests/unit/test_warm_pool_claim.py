"""``WarmPool.claim`` with fake warm starts and a real ``StartGate``: a create that finds no
ready container takes one the pool is starting instead of starting its own beside it, waits
only for starts that hold a slot and that no earlier claim waits for, and stops waiting when
the start fails or its patience runs out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.unit.warm_starts import Starts, until

from sandlot.images.model import Image
from sandlot.runtime.admission import StartGate
from sandlot.runtime.oci.pool import WarmPool

IMAGE = Image(name="base", id="sha256:base", lower_dirs=[Path("/nonexistent")])


async def _pool(starts: Starts, gate: StartGate, size: int = 1) -> WarmPool:
    pool = WarmPool(size, ["base"], starts.make, starts.discard, parallel=1, gate=gate)
    pool.prewarm(IMAGE)
    await until(lambda: starts.begun == 1)  # its first warm start holds a slot
    return pool


async def test_a_claim_takes_the_container_being_started() -> None:
    starts, gate = Starts(hold=True), StartGate(slots=4)
    pool = await _pool(starts, gate)
    claim = asyncio.ensure_future(pool.claim(IMAGE))
    await asyncio.sleep(0.05)
    assert not claim.done()  # waiting for the start under way, not going cold
    starts.release()
    warm = await asyncio.wait_for(claim, 1.0)
    assert warm is not None and warm.container_id == "_pool-0"
    assert (pool.claims, pool.misses) == (1, 0)
    await pool.stop()


async def test_no_wait_without_a_start_holding_a_slot() -> None:
    """A refill queued behind a request's start is not under way: waiting for it would wait
    for the create's own start."""
    starts, gate = Starts(hold=True), StartGate(slots=1)
    async with gate.slot():  # a request's start holds the only slot
        pool = WarmPool(1, ["base"], starts.make, starts.discard, gate=gate)
        pool.prewarm(IMAGE)
        await asyncio.sleep(0.05)
        assert starts.begun == 0
        t0 = time.monotonic()
        assert await pool.claim(IMAGE) is None
        assert time.monotonic() - t0 < 0.05
        assert pool.misses == 1
    await pool.stop()


async def test_one_start_under_way_serves_one_waiting_claim() -> None:
    starts, gate = Starts(hold=True), StartGate(slots=4)
    pool = await _pool(starts, gate)
    first = asyncio.ensure_future(pool.claim(IMAGE))
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    assert await pool.claim(IMAGE) is None  # the only start under way is the first's
    assert time.monotonic() - t0 < 0.05
    starts.release()
    assert (await asyncio.wait_for(first, 1.0)) is not None
    await pool.stop()


async def test_a_failed_start_frees_its_waiting_claim() -> None:
    starts, gate = Starts(hold=True), StartGate(slots=4)
    pool = await _pool(starts, gate)
    claim = asyncio.ensure_future(pool.claim(IMAGE, patience=5.0))
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    starts.release(ok=False)
    assert await asyncio.wait_for(claim, 1.0) is None  # goes cold now, not after 5 s
    assert time.monotonic() - t0 < 0.5
    assert (pool.claims, pool.misses) == (0, 1)
    await pool.stop()


async def test_a_stalled_start_holds_a_claim_only_its_patience() -> None:
    starts, gate = Starts(hold=True), StartGate(slots=4)
    pool = await _pool(starts, gate)
    t0 = time.monotonic()
    assert await pool.claim(IMAGE, patience=0.2) is None
    assert 0.2 <= time.monotonic() - t0 < 1.0
    starts.release()  # the stalled start ends: its container joins the pool
    await until(lambda: pool.ready_count("base") == 1)
    await pool.stop()


async def test_the_pools_starts_hold_background_slots() -> None:
    """Warm starts take the gate's background slots: none begins while a request's start
    runs, and a request's start is not kept waiting by them."""
    starts, gate = Starts(hold=True), StartGate(slots=2)
    pool = await _pool(starts, gate, size=1)
    assert gate.running == 1 and gate.running_requests == 0
    async with gate.slot():  # a request gets the free slot beside the warm start
        assert gate.running_requests == 1
    starts.release()
    await until(lambda: gate.running == 0)
    await pool.stop()
