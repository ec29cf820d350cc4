"""Warm pools of snapshots (oci/snapshot_pools.py) with real runc: the first create from a
snapshot starts its pool, the next ones are claims that look exactly like a cold create
(files, env, hostname, limits, users of the snapshot); at most ``snapshot_pools_max`` pools
are kept, an idle one is drained, and a snapshot's delete drains its pool first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.errors import Conflict
from sandlot.images.model import Image
from sandlot.runtime.base import SandboxSpec
from sandlot.runtime.oci import OciRuntime
from sandlot.runtime.oci import cgroups as cg
from sandlot.runtime.oci.pool import is_pool_id
from tests.runtime.helpers import TEST_IMAGES, leftovers, runc_exec, spec, wait_ping


def sh(rt: OciRuntime, sid: str, script: str) -> str:
    r = runc_exec(rt, sid, script)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
async def rt(runtime_data_dir: Path) -> AsyncIterator[OciRuntime]:
    cfg = Config(data_dir=runtime_data_dir)
    cfg.runtime.snapshot_pool_size = 1
    cfg.runtime.snapshot_pools_max = 1
    cfg.runtime.snapshot_pool_idle_seconds = 600
    runtime = await OciRuntime.open(cfg, images=TEST_IMAGES)
    try:
        yield runtime
    finally:
        ids = await runtime.list_ids()
        for sid in ids:
            await runtime.delete(sid)
        made = set(runtime._made_warm)
        await runtime.close()
        assert not [c for c in runtime._container_ids() if c in made], "warm containers leaked"
        left = {sid: what for sid in ids | made if (what := leftovers(runtime, sid))}
        assert not left, left


def _pool_containers(rt: OciRuntime) -> set[str]:
    """Unclaimed warm containers on the host."""
    claimed = set(rt.claims.items().values())
    return {c for c in rt._container_ids() if is_pool_id(c) and c not in claimed}


async def _snapshot_of(rt: OciRuntime, image: Image, sid: str, snap: str, text: str) -> None:
    await rt.create(spec(sid, image))
    await wait_ping(rt, sid)
    sh(rt, sid, f"echo {text} > /workspace/w && rm /etc/debian_version")
    await rt.snapshot(sid, snap)


async def test_warm_claim_matches_a_cold_create(rt: OciRuntime, rt_image: Image) -> None:
    await _snapshot_of(rt, rt_image, "spsrc", "sp-a", "alpha")
    before = _pool_containers(rt)

    await rt.create(spec("spcold", rt_image, snapshot_id="sp-a"))  # a miss: starts the pool
    assert rt.container_id("spcold") == "spcold"
    assert rt.snapshot_pools.kept() == ["sp-a"]
    await rt.snapshot_pools.wait_full("sp-a", timeout=120)
    assert rt.snapshot_pools.ready_count("sp-a") == 1

    warm_spec = SandboxSpec("spwarm", TEST_IMAGES.add(rt_image), entrypoint=[],
                            env={"GREETING": "hi"}, execd_token="tokw",
                            memory_bytes=256 << 20, snapshot_id="sp-a")
    await rt.create(warm_spec)
    assert is_pool_id(rt.container_id("spwarm"))  # served by the snapshot's pool
    await wait_ping(rt, "spwarm")
    cold_out = sh(rt, "spcold", "cat /workspace/w; test -e /etc/debian_version || echo gone")
    warm_out = runc_exec(rt, "spwarm", "cat /workspace/w; test -e /etc/debian_version || "
                         "echo gone; echo $GREETING; hostname", token="tokw")
    assert warm_out.returncode == 0, warm_out.stderr
    assert warm_out.stdout.split() == [*cold_out.split(), "hi", "spwarm"]
    # Its limits are the create's, as a cold one's (cgroup v1 here, v2 when unified).
    cid = rt.container_id("spwarm")
    v1 = cg.controller_dir(cid, "memory")
    limit = (v1 / "memory.limit_in_bytes" if v1 is not None
             else Path("/sys/fs/cgroup") / cg.PARENT / cid / "memory.max")
    assert int(limit.read_text()) == 256 << 20
    sh(rt, "spcold", "echo cold > /workspace/mine")
    assert runc_exec(rt, "spwarm", "cat /workspace/mine", token="tokw").returncode != 0

    # A claimed sandbox uses the snapshot as a cold one does: delete refused, pool kept.
    with pytest.raises(Conflict):
        await rt.delete_snapshot("sp-a")
    assert rt.snapshots.users("sp-a") == ["spcold", "spwarm"]

    # The pool refills after the claim; a second snapshot evicts it (at most 1 kept).
    await rt.snapshot_pools.wait_full("sp-a", timeout=120)
    await _snapshot_of(rt, rt_image, "spsrc2", "sp-b", "beta")
    await rt.create(spec("spb", rt_image, snapshot_id="sp-b"))
    assert rt.snapshot_pools.kept() == ["sp-b"]
    await rt.snapshot_pools.wait_full("sp-b", timeout=120)
    for _ in range(200):  # sp-a's warm container is removed in the background
        if len(_pool_containers(rt) - before) == 1:
            break
        await asyncio.sleep(0.1)
    assert len(_pool_containers(rt) - before) == 1, rt.warm_pools()

    # Deleting a snapshot drains its pool first, and nothing of it stays.
    for sid in ("spcold", "spwarm", "spb"):
        await rt.delete(sid)
    await rt.delete_snapshot("sp-b")
    assert rt.snapshot_pools.kept() == []
    assert _pool_containers(rt) - before == set()
    assert not (rt.data_dir / "snapshots" / "sp-b").exists()
    await rt.delete_snapshot("sp-a")


async def test_idle_pool_is_drained(rt: OciRuntime, rt_image: Image) -> None:
    rt.snapshot_pools.idle_seconds = 1.0
    await _snapshot_of(rt, rt_image, "spidle", "sp-i", "idle")
    await rt.create(spec("spi1", rt_image, snapshot_id="sp-i"))
    assert rt.snapshot_pools.kept() == ["sp-i"]
    for _ in range(600):
        if not rt.snapshot_pools.kept() and not [
                c for c in _pool_containers(rt) if c in rt._made_warm]:
            break
        await asyncio.sleep(0.1)
    assert rt.snapshot_pools.kept() == []
    assert not [c for c in _pool_containers(rt) if c in rt._made_warm]
    await rt.delete("spi1")
    await rt.delete_snapshot("sp-i")
