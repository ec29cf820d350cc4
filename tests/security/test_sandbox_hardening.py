"""Issue 11's findings at the runtime boundary: each stays fixed (real runc sandboxes).

Workload commands run through ``runc exec`` with the container's own process settings (see
test_isolation.py); host-side attacks run as the unprivileged host user ``nobody``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sandlot.errors import InvalidRequest
from sandlot.images.model import Image, ImageConfig
from sandlot.runtime.oci import OciRuntime
from sandlot.runtime.oci.imageuser import resolve_user
from tests.runtime.helpers import EXECD_PID, execd_client, runc_exec, spec, wait_ping
from tests.socket_families import PROBE_COMMAND, check_families

PY = "python3 -c"


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the unprivileged host user nobody (an attacker sharing the host)."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=30)


async def test_vsock_and_other_socket_families_are_refused(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("sockfam", rt_image))
    r = runc_exec(rt, "sockfam", PROBE_COMMAND)
    assert r.returncode == 0, r.stderr
    check_families(r.stdout)


async def test_image_trees_are_unreachable_to_host_users(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    layer = rt_image.lower_dirs[0]
    target = layer / "usr" / "bin" / "env"
    assert target.exists()
    r = as_nobody("stat", str(target))
    assert r.returncode != 0 and "Permission denied" in r.stderr, r


async def test_sandbox_root_is_mounted_nosuid(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("nosuid", rt_image))
    rootfs = os.path.realpath(rt.rootfs_of("nosuid"))
    with open("/proc/self/mountinfo") as fh:
        opts = [ln.split()[5] for ln in fh if ln.split()[4] == rootfs]
    assert opts, "the overlay is mounted"
    assert "nosuid" in opts[0].split(","), opts
    assert "nodev" in opts[0].split(","), opts


async def test_execd_token_not_in_its_environment_and_execd_not_dumpable(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    token = "tok-" + os.urandom(8).hex()
    await rt.create(spec("tokenv", rt_image, execd_token=token))
    await wait_ping(rt, "tokenv")
    r = runc_exec(rt, "tokenv", f"E={EXECD_PID}; cat /proc/1/environ /proc/$E/environ 2>&1 | "
                  "tr '\\0' '\\n'; grep -r . /proc/$E/environ /proc/$E/cmdline 2>&1 | "
                  "tr '\\0' ' '; cat /proc/$E/status | grep -i '^Uid'; "
                  "ls -l /proc/$E/fd 2>&1 | head -3; true", token=token)
    assert token not in r.stdout + r.stderr
    # Attaching to execd (what a workload would do to stop or inspect it) is refused.
    script = (
        "import ctypes, errno, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.ptrace(16, int(sys.argv[1]), 0, 0)\n"  # PTRACE_ATTACH
        "print('attach', rc, errno.errorcode.get(ctypes.get_errno()))\n"
    )
    r = runc_exec(rt, "tokenv", f"{PY} \"$(cat <<'EOF'\n{script}EOF\n)\" {EXECD_PID}",
                  token=token)
    assert r.stdout.split() == ["attach", "-1", "EPERM"], r
    await wait_ping(rt, "tokenv")  # and execd still serves


def token_client(rt: OciRuntime, sandbox_id: str, token: str) -> httpx.AsyncClient:
    return execd_client(rt, sandbox_id, timeout=60, headers={"X-EXECD-ACCESS-TOKEN": token})


async def test_fork_bomb_does_not_outlive_its_timeout(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("bombtime", rt_image, execd_token="t", pids_limit=256))
    await wait_ping(rt, "bombtime")
    async with token_client(rt, "bombtime", "t") as c:
        # The leader returns at once; its background children keep forking.
        async with c.stream("POST", "/command",
                            json={"command": ":(){ :|:& };:", "timeout": 1500}) as r:
            assert r.status_code == 200
            async for _ in r.aiter_lines():
                pass
        # Within a few seconds of the timeout the bomb is gone and the sandbox works again.
        deadline = time.monotonic() + 30
        count = -1
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            r3 = await asyncio.to_thread(runc_exec, rt, "bombtime", "ls /proc | grep -c '^[0-9]'",
                                         20, "t")
            if r3.returncode == 0 and r3.stdout.strip().isdigit():
                count = int(r3.stdout)
                if count < 10:
                    break
        assert 0 < count < 10, count
        r2 = await c.post("/command", json={"command": "echo alive", "timeout": 5000})
        assert "alive" in r2.text, r2.text[-500:]


async def test_execd_refuses_out_of_range_timeout(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("exectime", rt_image, execd_token="t"))
    await wait_ping(rt, "exectime")
    async with token_client(rt, "exectime", "t") as c:
        for timeout in (10**20, 2**63):
            r = await c.post("/command", json={"command": "true", "timeout": timeout})
            assert r.status_code == 400, r.text
            assert "timeout" in r.json()["message"]


async def test_root_in_a_sandbox_is_an_unprivileged_host_uid_of_its_own(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    assert rt.user_namespaces, "this kernel supports idmapped mounts: user namespaces are on"
    await rt.create(spec("usr-a", rt_image))
    await rt.create(spec("usr-b", rt_image))
    bases = []
    for sid in ("usr-a", "usr-b"):
        await wait_ping(rt, sid)
        r = runc_exec(rt, sid, "id -u; cat /proc/self/uid_map; stat -c %u:%g /etc/passwd "
                      "/usr/bin/env; touch /etc/owned && stat -c %u /etc/owned")
        assert r.returncode == 0, r
        lines = r.stdout.split("\n")
        assert lines[0] == "0"  # root inside...
        inside, host, size = (int(x) for x in lines[1].split())
        assert inside == 0 and host >= 65536 and size == 65536  # ...an unprivileged uid outside
        assert lines[2:4] == ["0:0", "0:0"]  # image files are root's inside (idmapped)
        assert lines[4] == "0"
        pid = (await rt.inspect(sid)).pid
        assert pid is not None
        assert os.stat(f"/proc/{pid}").st_uid == host  # execd's host uid
        bases.append(host)
        # The image layer is shared, not copied: the sandbox sees it through a mount.
        with open("/proc/self/mountinfo") as fh:
            lower_mounts = [ln for ln in fh if str(rt.paths(sid).lower) in ln]
        assert lower_mounts, "the image layer is an (idmapped) bind mount"
        assert (rt.paths(sid).upper / "etc" / "owned").stat().st_uid == host
    assert bases[0] != bases[1]  # a range of its own per sandbox


async def test_sandbox_files_are_unreachable_to_host_users(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    await rt.create(spec("hostuser", rt_image))
    await wait_ping(rt, "hostuser")
    rootfs = rt.rootfs_of("hostuser")
    assert (rootfs / "usr" / "bin" / "env").exists()
    for path in (rootfs / "usr" / "bin" / "env", rt.paths("hostuser").upper):
        r = as_nobody("stat", str(path))
        assert r.returncode != 0 and "Permission denied" in r.stderr, r


async def test_image_user_workdir_and_env_are_honoured(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    image = dataclasses.replace(rt_image, config=ImageConfig(
        env=["PATH=/usr/bin:/bin", "IMAGE_GREETING=from-image"], working_dir="/tmp",
        user="nobody:nogroup"))
    s = spec("imguser", image)
    s.entrypoint = ["sh", "-c", "id -u > /tmp/entry-uid; sleep 600"]
    await rt.create(s)
    await wait_ping(rt, "imguser")
    r = runc_exec(rt, "imguser", "id -u; id -g; pwd; echo $IMAGE_GREETING")
    assert r.returncode == 0, r
    assert r.stdout.split() == ["65534", "65534", "/tmp", "from-image"]
    for _ in range(100):
        r = runc_exec(rt, "imguser", "cat /tmp/entry-uid 2>/dev/null")
        if r.stdout.strip():
            break
        await asyncio.sleep(0.1)
    assert r.stdout.strip() == "65534"  # the entrypoint too


def test_image_user_lookup_never_follows_symlinks(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    (layer / "etc").mkdir(parents=True)
    (layer / "etc" / "passwd").symlink_to("/etc/passwd")  # host root's entry must not count
    with pytest.raises(InvalidRequest):
        resolve_user("daemon", [layer])
    (layer / "etc" / "passwd").unlink()
    (layer / "etc" / "passwd").write_text("app:x:1234:4321::/home/app:/bin/sh\n")
    assert resolve_user("app", [layer]) == (1234, 4321)
    assert resolve_user("77:88", [layer]) == (77, 88)
    assert resolve_user("root", [layer]) is None
