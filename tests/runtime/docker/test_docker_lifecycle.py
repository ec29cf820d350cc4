"""The docker backend against a real (private) dockerd: create, connect, pause, delete,
reconciliation from labels, containers removed behind sandlot's back, and the engine-side
settings each container gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.errors import Conflict, NotFound
from sandlot.runtime.base import ContainerState
from sandlot.runtime.bundle_prune import used_on_host
from sandlot.runtime.docker import DockerRuntime
from sandlot.runtime.docker.container import (
    LABEL_OWNER,
    LABEL_SANDBOX,
    bundles_named,
    container_name,
)
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.conftest import closing, open_docker_runtime
from tests.runtime.docker.helpers import adexec, dspec, wait_ready


def _attrs(engine: PrivateDockerd, sandbox_id: str) -> dict:
    assert engine.client is not None
    return engine.client.api.inspect_container(container_name(sandbox_id))


async def test_create_connect_pause_resume_delete(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    result = await rt.create(dspec("dk-life", docker_base_image, entrypoint=["sleep", "600"]))
    # a cold create waits in its start slot until execd answers (admission.py, as on oci)
    assert result.execd_ready is True
    await wait_ready(rt, "dk-life")
    info = await rt.inspect("dk-life")
    assert info.state == ContainerState.RUNNING and info.pid
    # execd is the container's init, from the read-only bundle; the entrypoint is its child
    r = await adexec(private_dockerd, "dk-life", "tr '\\0' ' ' < /proc/1/cmdline; echo; "
                     "ps -o args= -p $(pgrep -x sleep) ; hostname; pwd")
    first, sleep_args, hostname, cwd = r.output.splitlines()[:4]
    assert "/opt/sandlot/" in first and "sandlot.execd" in first
    assert sleep_args == "sleep 600"
    assert hostname == "dk-life"
    assert cwd == "/workspace"
    attrs = _attrs(private_dockerd, "dk-life")
    labels = attrs["Config"]["Labels"]
    assert labels[LABEL_SANDBOX] == "dk-life" and labels[LABEL_OWNER] == rt.plan.owner
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert mounts["/opt/sandlot"]["RW"] is False
    assert Path(mounts["/opt/sandlot"]["Source"]) == rt.plan.bundle.path
    # what a start's bundle prune asks: the engine's list names it, the container mounts it
    assert private_dockerd.client is not None
    owned = private_dockerd.client.api.containers(
        all=True, filters={"label": [f"{LABEL_OWNER}={rt.plan.owner}"]})
    assert bundles_named(owned) == {rt.plan.bundle.path}
    assert used_on_host([rt.plan.bundle.path]) == {rt.plan.bundle.path}
    # the token reached execd, and execd scrubbed it from what it starts
    r = await adexec(private_dockerd, "dk-life", "tr '\\0' '\\n' < /proc/$(pgrep -x sleep)/environ")
    assert "SANDLOT_EXECD_TOKEN" not in r.output and "PYTHONHOME" not in r.output

    with pytest.raises(Conflict):
        await rt.create(dspec("dk-life", docker_base_image))

    await rt.pause("dk-life")
    assert (await rt.inspect("dk-life")).state == ContainerState.PAUSED
    await rt.pause("dk-life")  # idempotent
    await rt.resume("dk-life")
    assert (await rt.inspect("dk-life")).state == ContainerState.RUNNING
    await wait_ready(rt, "dk-life")

    await rt.delete("dk-life")
    await rt.delete("dk-life")  # idempotent
    assert (await rt.inspect("dk-life")).state == ContainerState.MISSING
    with pytest.raises(NotFound):
        await rt.connect("dk-life", rt.plan.execd_port)


async def test_limits_and_hardening_reach_the_engine(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-lim", docker_base_image, cpu_cores=0.5, memory_bytes=256 << 20,
                          pids_limit=300))
    await wait_ready(rt, "dk-lim")
    host = _attrs(private_dockerd, "dk-lim")["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 256 << 20
    assert host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 300  # min of the spec's and [docker] pids_limit (4096)
    assert "no-new-privileges=true" in host["SecurityOpt"]
    assert {"NET_RAW", "SYS_ADMIN", "MKNOD", "SYS_PTRACE"} <= set(host["CapDrop"])
    assert host["NetworkMode"] == "bridge"
    r = await adexec(private_dockerd, "dk-lim", "grep -E '^(Seccomp|NoNewPrivs|CapEff):' "
                     "/proc/1/status")
    status = dict(line.split(":\t") for line in r.output.strip().splitlines())
    assert status["Seccomp"].strip() == "2"  # the engine's default filter
    assert status["NoNewPrivs"].strip() == "1"
    cap_eff = int(status["CapEff"], 16)
    for bit in (13, 21, 27, 19):  # NET_RAW, SYS_ADMIN, MKNOD, SYS_PTRACE
        assert not cap_eff >> bit & 1


async def test_restart_finds_sandboxes_from_labels_only(
    docker_host: str, docker_base_image: str, private_dockerd: PrivateDockerd,
    docker_data_dir: Path, tmp_path: Path,
) -> None:
    first = await open_docker_runtime(docker_data_dir)
    try:
        await first.create(dspec("dk-keep", docker_base_image))
        await wait_ready(first, "dk-keep")
    finally:
        await first.close()  # a server stop: the sandbox keeps running
    again = await open_docker_runtime(docker_data_dir)
    try:
        assert await again.list_ids() == {"dk-keep"}
        assert (await again.inspect("dk-keep")).state == ContainerState.RUNNING
        await wait_ready(again, "dk-keep")
        # another sandlot (another data dir) on the same engine sees none of it
        other_dir = tmp_path / "other"
        other_dir.mkdir(mode=0o700)
        (other_dir / "execd-bundle").symlink_to(docker_data_dir / "execd-bundle")
        other = await open_docker_runtime(other_dir)
        try:
            assert await other.list_ids() == set()
            assert (await other.inspect("dk-keep")).state == ContainerState.MISSING
            await other.delete("dk-keep")  # not its sandbox: left alone
        finally:
            await other.close()
        assert (await again.inspect("dk-keep")).state == ContainerState.RUNNING
    finally:
        await closing(again, private_dockerd)


async def test_container_removed_behind_sandlots_back_is_missing(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-gone", docker_base_image))
    await wait_ready(rt, "dk-gone")
    assert private_dockerd.client is not None
    private_dockerd.client.containers.get(container_name("dk-gone")).remove(force=True)
    info = await rt.inspect("dk-gone")
    assert info.state == ContainerState.MISSING
    assert info.reason and "gone" in info.reason
    assert "dk-gone" not in await rt.list_ids()
    with pytest.raises(NotFound):
        await rt.connect("dk-gone", rt.plan.execd_port)
    with pytest.raises(NotFound):
        await rt.pause("dk-gone")


async def test_exited_init_is_stopped(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-exit", docker_base_image))
    await wait_ready(rt, "dk-exit")
    await adexec(private_dockerd, "dk-exit", "kill -KILL 1 2>/dev/null; true")
    assert private_dockerd.client is not None
    private_dockerd.client.api.kill(container_name("dk-exit"))
    private_dockerd.client.api.wait(container_name("dk-exit"), timeout=30)
    info = await rt.inspect("dk-exit")
    assert info.state == ContainerState.STOPPED and info.exit_code is not None
    with pytest.raises(Conflict):
        await rt.pause("dk-exit")
    with pytest.raises(ConnectionRefusedError):
        await rt.connect("dk-exit", rt.plan.execd_port)
