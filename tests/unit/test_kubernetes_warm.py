"""The warm-Pod keeper's bookkeeping (kubernetes/warm.py) with a fake start and discard:
what a warm Pod may serve, claims and misses, refills, forgotten Pods and the stop."""

from __future__ import annotations

import asyncio
import dataclasses

from sandlot.images.model import RegistryAuth
from sandlot.runtime.base import ImageRef, SandboxSpec, VolumeSpec
from sandlot.runtime.kubernetes.warm import WarmKeeper, WarmPod, warm_labels_patch

TEMPLATE = SandboxSpec(sandbox_id="warm-template", image=ImageRef("python:3.12"),
                       entrypoint=[], cpu_cores=0.5, memory_bytes=256 << 20)


def same(a: SandboxSpec, b: SandboxSpec) -> bool:
    return (a.cpu_cores, a.memory_bytes) == (b.cpu_cores, b.memory_bytes)


class Fake:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started: list[SandboxSpec] = []
        self.discarded: list[str] = []

    async def make(self, spec: SandboxSpec) -> WarmPod:
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("no node")
        self.started.append(spec)
        return WarmPod(f"sandlot-{spec.sandbox_id}", spec.execd_token or "", "198.19.0.9")

    async def discard(self, name: str) -> None:
        self.discarded.append(name)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_only_a_create_a_cold_start_would_give_the_same_pod_fits() -> None:
    keeper = WarmKeeper("p", TEMPLATE, 1, Fake().make, Fake().discard)
    like = dataclasses.replace(TEMPLATE, sandbox_id="s1", env={"A": "1"}, entrypoint=["x"])
    assert keeper.fits(like, same)
    for other in (dataclasses.replace(like, cpu_cores=1.0),
                  dataclasses.replace(like, image=ImageRef("python:3.13")),
                  dataclasses.replace(like, image=ImageRef("python:3.12",
                                                           RegistryAuth("u", "p"))),
                  dataclasses.replace(like, volumes=[VolumeSpec("v", "pvc", "c", "/d")]),
                  dataclasses.replace(like, snapshot_id="snap")):
        assert not keeper.fits(other, same), other


async def test_claims_refill_misses_forget_and_stop() -> None:
    fake = Fake()
    keeper = WarmKeeper("p", TEMPLATE, 2, fake.make, fake.discard)
    keeper.fill()
    await settle()
    assert len(keeper.ready) == 2
    # each warm Pod has its own id and pool token
    assert len({s.sandbox_id for s in fake.started}) == 2
    assert all(s.execd_token for s in fake.started)
    assert len({s.execd_token for s in fake.started}) == 2
    first = keeper.take()
    assert first is not None and keeper.claims == 1
    await settle()
    assert len(keeper.ready) == 2  # refilled
    keeper.forget(keeper.ready[0].name)
    await settle()
    assert len(keeper.ready) == 2 and len(fake.started) == 4
    keeper.resize(0)
    await settle()
    assert keeper.ready == [] and len(fake.discarded) == 2
    assert keeper.take() is None and keeper.misses == 1
    keeper.resize(1)
    await settle()
    names = await keeper.stop()
    assert len(names) == 1 and keeper.ready == []
    keeper.fill()
    await settle()
    assert len(fake.started) == 5  # a stopped keeper starts nothing


async def test_a_failing_start_gives_up_until_a_create_wants_one() -> None:
    fake = Fake(fail=True)
    keeper = WarmKeeper("p", TEMPLATE, 1, fake.make, fake.discard)
    keeper.fill()
    await settle()
    assert keeper.ready == [] and keeper.stats().ready == 0
    fake.fail = False
    await settle()
    assert fake.started == []  # gave up after repeated failures
    assert keeper.take() is None  # a miss: try again
    await settle()
    assert len(keeper.ready) == 1


def test_the_claim_patch_names_the_sandbox_and_drops_the_warm_label() -> None:
    patch = warm_labels_patch("s1", {"sandlot.io/sandbox-id": "s1"})
    assert patch["metadata"]["labels"] == {"sandlot.io/sandbox-id": "s1", "sandlot.io/warm": None}
