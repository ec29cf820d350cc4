"""The warm pool of OciRuntime: a claimed warm container is an ordinary sandbox (hostname, env,
token, limits, entrypoint), the pool refills, nothing leaks on delete or across a restart."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandlot.config import Config
from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState, SandboxSpec
from sandlot.runtime.oci import OciRuntime
from sandlot.runtime.oci import cgroups as cg
from sandlot.runtime.oci.pool import is_pool_id
from tests.runtime.helpers import (
    TEST_IMAGES,
    execd_client,
    leftovers,
    runc_exec,
    spec,
    wait_ping,
)


async def _open(data_dir: Path, size: int = 1) -> OciRuntime:
    cfg = Config(data_dir=data_dir)
    cfg.runtime.warm_pool_size = size
    cfg.runtime.warm_pool_images = ["base"]
    return await OciRuntime.open(cfg, images=TEST_IMAGES)


@pytest.fixture
async def pooled(runtime_data_dir: Path, rt_image: Image) -> AsyncIterator[OciRuntime]:
    rt = await _open(runtime_data_dir)
    await rt.prewarm(TEST_IMAGES.add(rt_image))
    await rt.pool.wait_full(rt_image.name)
    try:
        yield rt
    finally:
        for sid in await rt.list_ids():
            await rt.delete(sid)
        await rt.close()
        assert not [c for c in rt._container_ids() if is_pool_id(c)], "warm containers leaked"


def _ready_token(rt: OciRuntime, image: Image) -> tuple[str, str]:
    warm = rt.pool._ready[image.name][0]
    return warm.container_id, warm.token


async def _command(rt: OciRuntime, sid: str, token: str | None, command: str) -> httpx.Response:
    headers = {"X-EXECD-ACCESS-TOKEN": token} if token else {}
    async with execd_client(rt, sid) as c:
        return await c.post("/command", json={"command": command}, headers=headers, timeout=30)


async def test_claim_gives_a_working_sandbox(pooled: OciRuntime, rt_image: Image) -> None:
    rt = pooled
    cid, pool_token = _ready_token(rt, rt_image)
    warm_cpu = cg.controller_dir(cid, "cpu")
    assert warm_cpu and int((warm_cpu / "cpu.shares").read_text()) == 64  # idles at low weight
    await rt.create(SandboxSpec(
        "pooled1", TEST_IMAGES.add(rt_image),
        entrypoint=["sh", "-c", "echo $GREETING > /workspace/ep"],
        env={"GREETING": "hi there"}, execd_token="tok1", memory_bytes=256 << 20,
        cpu_cores=0.5, pids_limit=123,
    ))
    assert rt.container_id("pooled1") == cid
    await wait_ping(rt, "pooled1")
    assert "pooled1" in await rt.list_ids() and cid not in await rt.list_ids()
    assert (await rt.inspect("pooled1")).state == ContainerState.RUNNING

    r = await _command(rt, "pooled1", "tok1", "echo $GREETING; hostname; cat /etc/hostname")
    assert r.status_code == 200, r.text
    assert "hi there" in r.text and r.text.count("pooled1") >= 2
    assert (await _command(rt, "pooled1", pool_token, "true")).status_code == 401
    assert (await _command(rt, "pooled1", None, "true")).status_code == 401

    mem, cpu, pids = (cg.controller_dir(cid, c) for c in ("memory", "cpu", "pids"))
    assert mem and cpu and pids
    assert int((mem / "memory.limit_in_bytes").read_text()) == 256 << 20
    if (mem / "memory.memsw.limit_in_bytes").exists():
        assert int((mem / "memory.memsw.limit_in_bytes").read_text()) == 256 << 20
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 50_000
    assert int((cpu / "cpu.shares").read_text()) == 1024  # a claimed sandbox gets full weight
    assert (pids / "pids.max").read_text().strip() == "123"

    ep = rt.paths("pooled1").upper / "workspace" / "ep"
    for _ in range(500):
        if ep.exists() and ep.read_text():
            break
        await asyncio.sleep(0.02)
    assert ep.read_text().strip() == "hi there"
    # the container's own processes cannot change the hostname back
    r = runc_exec(rt, cid, "hostname evil || echo refused", token="tok1")
    assert r.stdout.strip().endswith("refused")


async def test_pool_refills_and_delete_leaves_nothing(pooled: OciRuntime,
                                                      rt_image: Image) -> None:
    rt = pooled
    cid, _ = _ready_token(rt, rt_image)
    await rt.create(spec("pooled2", rt_image))
    assert rt.container_id("pooled2") == cid
    await rt.pool.wait_full(rt_image.name)
    new_cid, _ = _ready_token(rt, rt_image)
    assert new_cid != cid
    assert not any(is_pool_id(i) for i in await rt.list_ids())
    await rt.pause("pooled2")
    assert (await rt.inspect("pooled2")).state == ContainerState.PAUSED
    await rt.resume("pooled2")
    await rt.delete("pooled2")
    assert leftovers(rt, cid) == [] and leftovers(rt, "pooled2") == []
    assert "pooled2" not in await rt.list_ids()
    assert rt.claims.get("pooled2") is None
    assert (await rt.inspect("pooled2")).state == ContainerState.MISSING


async def test_other_images_are_not_pooled(pooled: OciRuntime, scratch_image: Image) -> None:
    rt = pooled
    await rt.prewarm(TEST_IMAGES.add(scratch_image))
    assert rt.pool.ready_count(scratch_image.name) == 0
    await rt.create(spec("cold1", scratch_image))
    assert rt.container_id("cold1") == "cold1"


async def test_broken_warm_container_falls_back_to_cold(pooled: OciRuntime,
                                                        rt_image: Image) -> None:
    rt = pooled
    cid, _ = _ready_token(rt, rt_image)
    await asyncio.to_thread(cg.kill_all, cid)  # the warm container's execd dies
    await rt.create(spec("fallback", rt_image))
    assert rt.container_id("fallback") == "fallback"
    await wait_ping(rt, "fallback")
    assert leftovers(rt, cid) == []


async def test_restart_keeps_claims_and_removes_stale_warm_containers(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    rt1 = await _open(runtime_data_dir, size=2)
    await rt1.prewarm(TEST_IMAGES.add(rt_image))
    await rt1.pool.wait_full(rt_image.name)
    await rt1.create(spec("survivor", rt_image, execd_token="tok-s"))
    cid = rt1.container_id("survivor")
    await rt1.pool.wait_full(rt_image.name)
    # a crash: the ready warm containers are abandoned, not deleted
    stale = await rt1.pool.stop()
    assert len(stale) == 2
    rt1._connector.close()
    assert rt1._pool_lock_fd is not None
    os.close(rt1._pool_lock_fd)  # a dead process holds no lock

    rt2 = await _open(runtime_data_dir, size=2)
    try:
        assert await rt2.list_ids() >= {"survivor"}
        assert rt2.container_id("survivor") == cid
        assert (await rt2.inspect("survivor")).state == ContainerState.RUNNING
        await wait_ping(rt2, "survivor")
        assert (await _command(rt2, "survivor", "tok-s", "hostname")).text.count("survivor")
        await rt2.leftovers.wait()  # removed in the background once the runtime is open
        for s in stale:
            assert leftovers(rt2, s) == [], s
        await rt2.delete("survivor")
        assert leftovers(rt2, cid) == []
    finally:
        for sid in await rt2.list_ids():
            await rt2.delete(sid)
        await rt2.close()


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.4])
async def test_close_while_filling_leaves_nothing(
    runtime_data_dir: Path, rt_image: Image, delay: float
) -> None:
    # close() can land at any point of a warm create (runc run, execd start-up, ping):
    # whatever was being made must still be removed.
    rt = await _open(runtime_data_dir, size=2)
    await rt.prewarm(TEST_IMAGES.add(rt_image))
    await asyncio.sleep(delay)
    await rt.close()
    leaked = [c for c in rt._container_ids() if is_pool_id(c)]
    assert not leaked, f"warm containers left after close: {leaked}"
    stray = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines()
             if str(runtime_data_dir) in ln and "_pool-" in ln]
    assert not stray


async def test_a_second_runtime_leaves_the_owners_warm_containers_alone(
    pooled: OciRuntime, rt_image: Image
) -> None:
    # A tool or test opening the same data dir while the server runs must not sweep its pool.
    warm = {w.container_id for w in pooled.pool._ready[rt_image.name]}
    assert warm
    other = await _open(pooled.data_dir, size=2)
    try:
        assert other.pool.size == 0  # not the owner: keeps no pool of its own
    finally:
        await other.close()
    assert warm <= pooled._container_ids()
    await pooled.create(spec("after-other", rt_image))
    assert pooled.container_id("after-other") in warm  # still claimable
