"""The docker backend's warm pool: containers started ahead with a pooled execd, claimed by
create (renamed, limits and hostname applied, entrypoint started), refilled, and removed
when the runtime closes; a second runtime on the same data dir keeps no pool of its own."""

from __future__ import annotations

from pathlib import Path

from sandlot.config import Config
from sandlot.runtime.base import ImageRef
from sandlot.runtime.docker import DockerRuntime
from sandlot.runtime.docker.container import LABEL_POOL, container_name
from sandlot.runtime.docker.warm import renamed_hosts
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.conftest import closing
from tests.runtime.docker.helpers import adexec, dspec, wait_ready


async def _open(data_dir: Path, image: str, size: int = 1) -> DockerRuntime:
    return await DockerRuntime.open(Config.model_validate({
        "data_dir": str(data_dir), "docker": {"network_mode": "bridge"},
        "runtime": {"warm_pool_size": size, "warm_pool_images": [image]}}))


def _warm_names(engine: PrivateDockerd, owner: str) -> list[str]:
    assert engine.client is not None
    found = engine.client.containers.list(all=True, filters={"label": [
        f"io.sandlot.owner={owner}", LABEL_POOL]})
    return sorted(c.name for c in found)


def test_hosts_file_rename() -> None:
    text = "127.0.0.1\tlocalhost\n# pool-ab here\n198.18.0.2\tpool-ab\n"
    assert renamed_hosts(text, "pool-ab", "sb-1") == (
        "127.0.0.1\tlocalhost\n# pool-ab here\n198.18.0.2\tsb-1\n")


async def test_claim_a_warm_container(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    rt = await _open(docker_data_dir, docker_base_image)
    try:
        await rt.prewarm(ImageRef(docker_base_image))
        await rt.pool.wait_full(docker_base_image, timeout=120)
        warm = _warm_names(private_dockerd, rt.plan.owner)
        assert len(warm) == 1 and warm[0].startswith("sandlot-_pool-")
        assert await rt.list_ids() == set()  # a warm container is no sandbox

        # a second runtime on the same data dir (a tool) keeps no pool and sweeps nothing
        other = await _open(docker_data_dir, docker_base_image)
        await other.prewarm(ImageRef(docker_base_image))
        assert other.pool.size == 0
        await other.close()
        assert _warm_names(private_dockerd, rt.plan.owner) == warm

        result = await rt.create(dspec("dk-claim", docker_base_image, cpu_cores=0.5,
                                       memory_bytes=256 << 20, env={"GREETING": "warm hi"},
                                       entrypoint=["sleep", "600"]))
        assert result.execd_ready is True
        await wait_ready(rt, "dk-claim")  # the sandbox's token, not the pool's
        assert private_dockerd.client is not None
        attrs = private_dockerd.client.api.inspect_container(container_name("dk-claim"))
        host = attrs["HostConfig"]
        assert host["Memory"] == 256 << 20 and host["CpuQuota"] == 50_000
        assert host["CpuShares"] == 1024
        r = await adexec(private_dockerd, "dk-claim",
                         "hostname; cat /etc/hostname; grep -c dk-claim /etc/hosts; "
                         "tr '\\0' '\\n' < /proc/$(pgrep -x sleep)/environ | grep GREETING")
        assert r.output.split("\n")[:4] == ["dk-claim", "dk-claim", "1", "GREETING=warm hi"]
        assert await rt.list_ids() == {"dk-claim"}

        # the pool refills; close removes the unclaimed warm container, not the sandbox
        await rt.pool.wait_full(docker_base_image, timeout=120)
        assert len(_warm_names(private_dockerd, rt.plan.owner)) == 2  # claimed + new
    finally:
        await rt.close()
    assert [n for n in _warm_names(private_dockerd, rt.plan.owner)] == ["sandlot-dk-claim"]
    again = await _open(docker_data_dir, docker_base_image, size=0)
    try:
        assert await again.list_ids() == {"dk-claim"}
        await wait_ready(again, "dk-claim")
    finally:
        await closing(again, private_dockerd)


async def test_images_the_engine_lacks_are_not_pooled(
    docker_host: str, docker_data_dir: Path, private_dockerd: PrivateDockerd,
) -> None:
    rt = await _open(docker_data_dir, "sandlot-test/not-here:1")
    try:
        await rt.prewarm(ImageRef("sandlot-test/not-here:1"))
        assert rt.pool.ready_count("sandlot-test/not-here:1") == 0
        assert _warm_names(private_dockerd, rt.plan.owner) == []
    finally:
        await closing(rt, private_dockerd)


async def test_snapshot_pool_claims_and_drains(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    """The first create from a snapshot starts its warm pool; the next is a claim of a
    container of the snapshot's image; the snapshot's delete removes the pool's containers."""
    rt = await DockerRuntime.open(Config.model_validate({
        "data_dir": str(docker_data_dir), "docker": {"network_mode": "bridge"},
        "runtime": {"warm_pool_size": 0, "snapshot_pool_size": 1}}))
    try:
        await rt.create(dspec("dk-snsrc", docker_base_image, entrypoint=["sleep", "600"]))
        await wait_ready(rt, "dk-snsrc")
        assert (await adexec(private_dockerd, "dk-snsrc", "echo kept > /tmp/k")).exit_code == 0
        await rt.snapshot("dk-snsrc", "dksnap")
        before = set(_warm_names(private_dockerd, rt.plan.owner))

        await rt.create(dspec("dk-snf1", docker_base_image, snapshot_id="dksnap"))  # cold
        assert rt.snapshot_pools.kept() == ["dksnap"]
        await rt.snapshot_pools.wait_full("dksnap", timeout=120)
        await rt.create(dspec("dk-snf2", docker_base_image, snapshot_id="dksnap",
                              env={"GREETING": "from the pool"}))
        await wait_ready(rt, "dk-snf2")
        warm = set(_warm_names(private_dockerd, rt.plan.owner)) - before
        assert "sandlot-dk-snf2" in warm and "sandlot-dk-snf1" not in warm  # a claim
        for sid in ("dk-snf1", "dk-snf2"):
            r = await adexec(private_dockerd, sid, "cat /tmp/k; hostname")
            assert r.output.split() == ["kept", sid]

        for sid in ("dk-snf1", "dk-snf2"):
            await rt.delete(sid)
        await rt.snapshot_pools.wait_full("dksnap", timeout=120)  # refilled after the claim
        await rt.delete_snapshot("dksnap")
        assert rt.snapshot_pools.kept() == []
        assert set(_warm_names(private_dockerd, rt.plan.owner)) - before == set()
        await rt.delete("dk-snsrc")
    finally:
        await rt.close()
