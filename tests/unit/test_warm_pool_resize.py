"""``WarmPool.resize`` with fake warm starts: a smaller size deletes the ready containers
beyond it (a named pool at ``bufferMax`` 0 kept its ready ones idle on the host and served
none of them), a start that ends after the pool shrank is deleted, not kept, and a larger
size refills."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.warm_starts import Starts, until

from sandlot.images.model import Image
from sandlot.runtime.oci.pool import WarmPool

IMAGE = Image(name="base", id="sha256:base", lower_dirs=[Path("/nonexistent")])


async def _full_pool(starts: Starts, size: int) -> WarmPool:
    pool = WarmPool(size, ["base"], starts.make, starts.discard, parallel=2)
    pool.prewarm(IMAGE)
    await pool.wait_full("base", timeout=5.0)
    return pool


async def test_shrinking_deletes_the_ready_containers_beyond_the_new_size() -> None:
    starts = Starts()
    pool = await _full_pool(starts, 3)
    before = pool.container_ids()
    pool.resize(1)
    assert pool.ready_count("base") == 1  # at once: a pool's status counts them
    await until(lambda: len(starts.discarded) == 2)
    assert set(starts.discarded) | pool.container_ids() == before
    assert pool.take(IMAGE) is not None  # the one kept still serves
    await pool.stop()


async def test_at_size_0_none_is_kept_and_none_served() -> None:
    starts = Starts()
    pool = await _full_pool(starts, 2)
    pool.resize(0)
    assert pool.ready_count("base") == 0
    await until(lambda: len(starts.discarded) == 2)
    assert pool.take(IMAGE) is None
    await asyncio.sleep(0.05)
    assert starts.begun == 2  # and none started again
    await pool.stop()


async def test_a_start_that_ends_after_the_pool_shrank_is_deleted() -> None:
    starts = Starts(hold=True)
    pool = WarmPool(2, ["base"], starts.make, starts.discard, parallel=2)
    pool.prewarm(IMAGE)
    await until(lambda: starts.begun == 2)
    pool.resize(0)
    starts.release_all()
    await until(lambda: len(starts.discarded) == 2)
    assert pool.ready_count("base") == 0
    await pool.stop()


async def test_growing_refills() -> None:
    starts = Starts()
    pool = await _full_pool(starts, 1)
    pool.resize(3)
    await pool.wait_full("base", timeout=5.0)
    assert pool.ready_count("base") == 3 and starts.discarded == []
    await pool.stop()
