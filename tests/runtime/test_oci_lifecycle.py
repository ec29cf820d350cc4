"""OciRuntime end to end with real runc: create, reach execd, pause, delete without a trace."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandlot.errors import Conflict, InvalidRequest, NotFound, RuntimeFailure
from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState
from sandlot.runtime.oci import OciRuntime, removal
from sandlot.runtime.oci import cgroups as cg
from sandlot.runtime.oci.layout import rootfs_folder
from tests.runtime.helpers import (
    EXECD_PID,
    TEST_IMAGES,
    leftovers,
    open_runtime,
    process_gone,
    runc_exec,
    spawn_detached,
    spec,
    wait_ping,
)


async def test_create_ping_delete_leaves_nothing(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("life1", rt_image))
    info = await rt.inspect("life1")
    assert info.state == ContainerState.RUNNING and info.pid
    assert (await wait_ping(rt, "life1")).status_code == 200
    assert "life1" in await rt.list_ids()
    assert cg.sandbox_cgroup_dirs("life1")
    pid = info.pid
    await rt.delete("life1")
    assert leftovers(rt, "life1") == []
    assert process_gone(pid)
    assert (await rt.inspect("life1")).state == ContainerState.MISSING
    await rt.delete("life1")  # idempotent


async def test_execd_is_pid1_with_workspace_and_hostname(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("life2", rt_image, env={"GREETING": "hi there"}))
    await wait_ping(rt, "life2")
    r = runc_exec(rt, "life2", f"tr '\\0' ' ' </proc/{EXECD_PID}/cmdline; echo; hostname; "
                  "echo $GREETING; touch /workspace/f && echo writable; "
                  "awk '$2 == \"/run/sandlot\" {print \"run:\" $3}' /proc/mounts")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "sandlot.execd" in lines[0] and "/opt/sandlot/" in lines[0]
    assert lines[1] == "life2"
    assert lines[2] == "hi there"
    assert "writable" in lines
    assert "run:tmpfs" in lines  # the sandbox's own, not a host dir (issue 11 finding 2)
    # execd is not dumpable: the workload cannot read its environment or memory
    env = runc_exec(rt, "life2", f"cat /proc/{EXECD_PID}/environ 2>&1; true").stdout
    assert "Permission denied" in env and "GREETING" not in env


async def test_execd_runs_in_image_without_python_or_libc(
    oci_runtime: OciRuntime, scratch_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("nolibc", scratch_image))
    r = await wait_ping(rt, "nolibc")
    assert r.status_code == 200
    await rt.delete("nolibc")
    assert leftovers(rt, "nolibc") == []


async def test_pause_and_resume_keep_processes(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("pz", rt_image))
    await wait_ping(rt, "pz")
    pid = (await rt.inspect("pz")).pid
    await rt.pause("pz")
    assert (await rt.inspect("pz")).state == ContainerState.PAUSED
    freezer = cg.controller_dir("pz", "freezer")
    assert freezer is not None and (freezer / "freezer.state").read_text().strip() == "FROZEN"
    await rt.pause("pz")  # pausing a paused sandbox is a no-op
    await rt.resume("pz")
    info = await rt.inspect("pz")
    assert info.state == ContainerState.RUNNING and info.pid == pid
    await wait_ping(rt, "pz")


async def test_delete_paused_sandbox(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("pzdel", rt_image))
    await rt.pause("pzdel")
    await rt.delete("pzdel")
    assert leftovers(rt, "pzdel") == []


async def test_limits_are_applied(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("lim", rt_image, memory_bytes=256 << 20, cpu_cores=0.5, pids_limit=123))
    mem = cg.controller_dir("lim", "memory")
    cpu = cg.controller_dir("lim", "cpu")
    pids = cg.controller_dir("lim", "pids")
    assert mem and cpu and pids
    assert int((mem / "memory.limit_in_bytes").read_text()) == 256 << 20
    if (mem / "memory.memsw.limit_in_bytes").exists():
        assert int((mem / "memory.memsw.limit_in_bytes").read_text()) == 256 << 20
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 50_000
    assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
    assert (pids / "pids.max").read_text().strip() == "123"
    # the sandbox sees its own limits through its read-only cgroupfs (execd's metrics read it)
    r = runc_exec(rt, "lim", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
                  "echo 1 > /sys/fs/cgroup/pids/pids.max || echo refused")
    assert r.stdout.split()[0] == str(256 << 20)
    assert "refused" in r.stdout


async def test_usage_of_many_sandboxes_is_read_in_one_go(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    """The monitor's sample of every live sandbox (``usage_many``): the same figures as one
    by one, None for one that is gone or not a sandbox id."""
    rt = oci_runtime
    await rt.create(spec("use", rt_image, memory_bytes=256 << 20))
    found = await rt.usage_many(["use", "gone", "not an id!"])
    assert set(found) == {"use", "gone", "not an id!"}
    one = await rt.usage("use")
    many = found["use"]
    assert one is not None and many is not None
    assert many.memory_limit_bytes == one.memory_limit_bytes == 256 << 20
    assert many.memory_bytes and many.cpu_seconds is not None and many.oom_kills == 0
    assert found["gone"] is None and found["not an id!"] is None


async def test_runtime_pids_limit_caps_the_request(runtime_data_dir: Path, rt_image: Image) -> None:
    from sandlot.config import Config

    cfg = Config(data_dir=runtime_data_dir)
    cfg.runtime.pids_limit = 77
    rt = await OciRuntime.open(cfg, images=TEST_IMAGES)
    try:
        await rt.create(spec("pidcap", rt_image, pids_limit=4096))
        pids = cg.controller_dir("pidcap", "pids")
        assert pids and (pids / "pids.max").read_text().strip() == "77"
    finally:
        await rt.delete("pidcap")
        await rt.close()


async def test_bad_requests(oci_runtime: OciRuntime, rt_image: Image, tmp_path: Path) -> None:
    rt = oci_runtime
    with pytest.raises(InvalidRequest):
        await rt.create(spec("../evil", rt_image))
    await rt.create(spec("dup", rt_image))
    with pytest.raises(Conflict):
        await rt.create(spec("dup", rt_image))
    assert (await rt.inspect("dup")).state == ContainerState.RUNNING
    with pytest.raises(NotFound):
        await rt.pause("nosuch")
    with pytest.raises(NotFound):
        await rt.connect("nosuch", 80)


async def test_failed_create_leaves_nothing(oci_runtime: OciRuntime, tmp_path: Path) -> None:
    rt = oci_runtime
    broken = Image(name="broken", id="broken", lower_dirs=[tmp_path / "missing-layer"])
    with pytest.raises(RuntimeFailure):
        await rt.create(spec("broken", broken))
    assert leftovers(rt, "broken") == []
    # runc itself fails half-way (a file bind-mounted onto a directory): all undone as well
    (tmp_path / "layer" / "etc" / "hosts").mkdir(parents=True)
    bad = Image(name="b2", id="b2", lower_dirs=[tmp_path / "layer"])
    with pytest.raises(RuntimeFailure) as err:
        await rt.create(spec("b2", bad))
    assert "runc" in err.value.message
    assert leftovers(rt, "b2") == []
    assert not cg.sandbox_cgroup_dirs("b2")


async def test_connect_reaches_port_inside(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    home = os.stat("/proc/thread-self/ns/net").st_ino
    await rt.create(spec("net", rt_image))
    await wait_ping(rt, "net")
    spawn_detached(rt, "net", "python3 -m http.server --bind 127.0.0.1 8123")
    for _ in range(200):
        try:
            sock = await rt.connect("net", 8123)
            break
        except OSError:
            await asyncio.sleep(0.05)
    else:
        raise AssertionError("port 8123 in the sandbox never accepted a connection")
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    data = await reader.read()
    writer.close()
    assert data.startswith(b"HTTP/1.0 200")
    # the host's own loopback does not have the sandbox's port
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", 8123)
    # the calling thread's namespace was restored: this process still sees the host's links
    assert os.path.exists("/sys/class/net/lo")
    assert os.stat("/proc/thread-self/ns/net").st_ino == home


async def test_sandboxes_survive_a_new_runtime_instance(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    """A server restart opens a fresh OciRuntime on the same data dir and finds its sandboxes."""
    first = await open_runtime(runtime_data_dir)
    await first.create(spec("keep", rt_image))
    await wait_ping(first, "keep")
    await first.close()
    second = await open_runtime(runtime_data_dir)
    try:
        assert "keep" in await second.list_ids()
        assert (await second.inspect("keep")).state == ContainerState.RUNNING
        await wait_ping(second, "keep")
    finally:
        await second.delete("keep")
        await second.close()
    assert leftovers(second, "keep") == []


async def test_a_rootfs_folder_a_crash_left_as_trash_is_swept_at_the_next_open(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    """A delete renames the sandbox's rootfs mount point folder aside, then removes it; a
    server killed in between left the renamed folder under the data dir's folder in
    /run/sandlot-rootfs for good (only the data dir's own trash was swept), and with it that
    folder, which a close removes only when empty."""
    first = await open_runtime(runtime_data_dir)
    await first.create(spec("swept", rt_image))
    await wait_ping(first, "swept")
    crashed = rootfs_folder(runtime_data_dir) / "crashed-delete"
    (crashed / "rootfs").mkdir(parents=True)
    trash = removal.set_aside(crashed)  # what remove_tree does before the kill
    assert trash is not None and trash.exists()
    await first.close()
    second = await open_runtime(runtime_data_dir)
    try:
        assert not trash.exists()
        await wait_ping(second, "swept")
    finally:
        await second.delete("swept")
        await second.close()
    assert not rootfs_folder(runtime_data_dir).exists()
