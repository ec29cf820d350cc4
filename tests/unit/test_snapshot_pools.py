"""SnapshotPools' bookkeeping with fake warm-container starts (the real ones are in
tests/runtime/test_snapshot_pools.py): a miss starts a pool, the cap drains the least
recently used one, an idle pool is drained, and a draining snapshot starts no pool."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from tests.unit.warm_starts import until

from sandlot.images.model import Image
from sandlot.runtime.admission import StartGate
from sandlot.runtime.oci.pool import Warm
from sandlot.runtime.oci.snapshot_pools import SnapshotPools


class FakeStarts:
    def __init__(self) -> None:
        self.live: set[str] = set()
        self._ids = itertools.count()

    async def make(self, image: Image) -> Warm:
        await asyncio.sleep(0.01)
        cid = f"_pool-{next(self._ids)}"
        self.live.add(cid)
        return Warm(cid, "tok", image.id)

    async def discard(self, cid: str) -> None:
        self.live.discard(cid)


def _image(snapshot_id: str) -> Image:
    return Image(name=f"snapshot/{snapshot_id}", id=f"snapshot:{snapshot_id}",
                 lower_dirs=[Path("/nonexistent")])


async def test_miss_starts_a_pool_and_the_next_create_claims() -> None:
    fake = FakeStarts()
    pools = SnapshotPools(2, 4, 600, fake.make, fake.discard)
    assert await pools.claim("a", _image("a")) is None
    assert pools.kept() == ["a"]
    await pools.wait_full("a", timeout=5)
    warm = await pools.claim("a", _image("a"))
    assert warm is not None and warm.container_id in fake.live
    assert pools.stats()["snapshot/a"].claims == 1
    await pools.stop()
    assert fake.live == {warm.container_id}  # the claimed one is the sandbox's now


async def test_cap_drains_the_least_recently_used() -> None:
    fake = FakeStarts()
    pools = SnapshotPools(1, 2, 600, fake.make, fake.discard)
    for sid in ("a", "b"):
        await pools.claim(sid, _image(sid))
        await pools.wait_full(sid, timeout=5)
    await pools.claim("a", _image("a"))  # a is used again: b is now the oldest
    await pools.claim("c", _image("c"))
    assert pools.kept() == ["a", "c"]
    await pools.wait_full("c", timeout=5)
    await until(lambda: len(fake.live) == 2)  # a's claimed one, c's; b's removed
    await pools.stop()


async def test_idle_pool_is_drained() -> None:
    fake = FakeStarts()
    pools = SnapshotPools(1, 4, 0.2, fake.make, fake.discard)
    await pools.claim("a", _image("a"))
    await until(lambda: pools.kept() == [] and not fake.live)
    await pools.stop()


async def test_a_draining_snapshot_starts_no_pool() -> None:
    fake = FakeStarts()
    pools = SnapshotPools(1, 4, 600, fake.make, fake.discard)
    await pools.claim("a", _image("a"))
    await pools.wait_full("a", timeout=5)
    async with pools.draining("a"):
        assert not fake.live and pools.kept() == []
        assert await pools.claim("a", _image("a")) is None
        assert pools.kept() == []
    assert await pools.claim("a", _image("a")) is None  # after the delete: a pool again
    assert pools.kept() == ["a"]
    await pools.stop()
    assert not fake.live


async def test_size_zero_is_off() -> None:
    fake = FakeStarts()
    pools = SnapshotPools(0, 4, 600, fake.make, fake.discard)
    assert await pools.claim("a", _image("a")) is None
    assert pools.kept() == [] and not fake.live


class HeldStarts(FakeStarts):
    """Starts that end when the test releases them."""

    def __init__(self) -> None:
        super().__init__()
        self.begun = 0
        self._held: list[asyncio.Future[None]] = []

    async def make(self, image: Image) -> Warm:
        self.begun += 1
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.append(held)
        await held
        return await super().make(image)

    def release(self) -> None:
        next(h for h in self._held if not h.done()).set_result(None)


async def test_a_create_from_a_snapshot_takes_the_warm_start_under_way() -> None:
    """As the image pools (``WarmPool.claim``): a create that finds none ready while the
    snapshot's pool is starting one waits for it rather than start a container beside it."""
    fake = HeldStarts()
    pools = SnapshotPools(1, 4, 600, fake.make, fake.discard, gate=StartGate(slots=4))
    assert await pools.claim("a", _image("a")) is None  # the first starts the pool: cold
    await until(lambda: fake.begun == 1)
    claiming = asyncio.ensure_future(pools.claim("a", _image("a")))
    await asyncio.sleep(0.05)
    assert not claiming.done()  # waiting for the start under way
    fake.release()
    warm = await claiming
    assert warm is not None and warm.container_id in fake.live
    assert pools.stats()["snapshot/a"].claims == 1
    await pools.stop()
