"""Issue 10's isolation checks on the docker backend: no host files or processes, the pids
and memory limits hold, the bundle cannot be changed from inside; and issue 11's: sandlot's
seccomp profile (socket-family allow list) holds there as on the oci backend."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from pathlib import Path

from sandlot.runtime.docker import DockerRuntime
from sandlot.runtime.docker.container import container_name
from sandlot.runtime.oci.seccomp import seccomp_profile
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.helpers import adexec, dspec, wait_ready
from tests.socket_families import PROBE_COMMAND, check_families


def _cgroup_file(engine: PrivateDockerd, sandbox_id: str, controller: str, name: str) -> Path:
    """A cgroup v1 (or v2) file of the container, found from its init's /proc entry."""
    assert engine.client is not None
    pid = engine.client.api.inspect_container(container_name(sandbox_id))["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path("/sys/fs/cgroup", controller, path.lstrip("/"), name)
        if controllers == "":
            return Path("/sys/fs/cgroup", path.lstrip("/"), name)
    raise AssertionError(f"no {controller} cgroup for {sandbox_id}")


async def test_cannot_see_host_processes_or_files(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    marker = Path("/tmp") / f"sandlot-host-file-{uuid.uuid4().hex}"
    content = f"content-{uuid.uuid4().hex}"
    marker.write_text(content)
    try:
        await rt.create(dspec("dk-see", docker_base_image))
        await wait_ready(rt, "dk-see")
        r = await adexec(private_dockerd, "dk-see",
                         "ls /proc | grep -c '^[0-9]*$'; cat /proc/*/cmdline | tr '\\0' ' '; "
                         f"echo; cat {marker} 2>&1; ls {rt.plan.bundle.path} 2>&1; true")
        nprocs = int(r.output.splitlines()[0])
        assert nprocs < 10  # execd, this shell and its children; never the host's hundreds
        assert "pytest" not in r.output and "dockerd" not in r.output
        assert content not in r.output
        assert r.output.count("No such file") == 2
    finally:
        marker.unlink()


async def test_cannot_change_the_execd_bundle(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    exe = rt.plan.bundle.path / "bin" / "python3"
    before = hashlib.sha256(exe.read_bytes()).hexdigest()
    await rt.create(dspec("dk-ro", docker_base_image))
    await wait_ready(rt, "dk-ro")
    r = await adexec(private_dockerd, "dk-ro",
                     "touch /opt/sandlot/evil 2>&1; echo junk > /opt/sandlot/bin/python3 2>&1; "
                     "mount -o remount,rw /opt/sandlot 2>&1; echo x > /etc/sandlot-new && "
                     "echo wrote-own; true")
    assert "wrote-own" in r.output  # the sandbox's own files are writable ...
    assert r.output.count("Read-only file system") >= 2  # ... the bundle is not
    assert "permission denied" in r.output.lower()  # and cannot be remounted
    assert not (rt.plan.bundle.path / "evil").exists()
    assert hashlib.sha256(exe.read_bytes()).hexdigest() == before


async def test_fork_bomb_stops_at_pids_limit(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-calm", docker_base_image))
    await rt.create(dspec("dk-bomb", docker_base_image, pids_limit=64, cpu_cores=0.5))
    await wait_ready(rt, "dk-bomb")
    assert private_dockerd.client is not None
    bomb = private_dockerd.client.containers.get(container_name("dk-bomb"))
    bomb.exec_run(["sh", "-c", "b() { b | b & }; b"], detach=True)
    events = _cgroup_file(private_dockerd, "dk-bomb", "pids", "pids.events")
    current = _cgroup_file(private_dockerd, "dk-bomb", "pids", "pids.current")
    for _ in range(300):  # bounded: at most ~15 s until the limit is hit
        if events.read_text().split()[1] != "0":
            break
        await asyncio.sleep(0.05)
    assert int(events.read_text().split()[1]) > 0
    assert int(current.read_text()) <= 64
    await wait_ready(rt, "dk-calm")  # the other sandbox is unaffected
    await rt.delete("dk-bomb")


async def test_memory_hog_is_oom_killed_and_execd_survives(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-hog", docker_base_image, memory_bytes=128 << 20))
    await wait_ready(rt, "dk-hog")
    r = await adexec(private_dockerd, "dk-hog",
                     "python3 -c 'b = []\nwhile True: b.append(bytearray(8 << 20))'; "
                     "echo exit=$?")
    assert "exit=137" in r.output, r.output  # SIGKILL by the OOM killer
    peak = _cgroup_file(private_dockerd, "dk-hog", "memory", "memory.max_usage_in_bytes")
    if peak.exists():  # cgroup v1
        assert int(peak.read_text()) <= (128 << 20) + (1 << 20)
    await wait_ready(rt, "dk-hog")  # execd (the container's init) is still there


async def test_sandlots_seccomp_profile_by_default(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    """Unset ``[docker] seccomp_profile``: the oci runtime's profile, not the engine's default
    (which lets AF_VSOCK through): the same socket families and denied calls as oci+runc."""
    rt = docker_runtime
    await rt.create(dspec("dk-seccomp", docker_base_image))
    await wait_ready(rt, "dk-seccomp")
    assert private_dockerd.client is not None
    opts = private_dockerd.client.api.inspect_container(
        container_name("dk-seccomp"))["HostConfig"]["SecurityOpt"]
    sec = [json.loads(o.split("=", 1)[1]) for o in opts if o.startswith("seccomp=")]
    assert sec == [seccomp_profile()], opts
    r = await adexec(private_dockerd, "dk-seccomp", PROBE_COMMAND)
    assert r.exit_code == 0, r.output
    check_families(r.output)
    r = await adexec(private_dockerd, "dk-seccomp",
                     "unshare -U true 2>&1; echo rc=$?; "
                     "python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
                     "sys.exit(0 if libc.syscall(321, 0, 0, 0) == -1 and "  # bpf(2) on x86_64
                     "ctypes.get_errno() == 1 else 1)'; echo bpf=$?")
    assert "rc=0" not in r.output and "bpf=0" in r.output, r.output
