"""The oci runtime under gVisor (runsc): real sandboxes, limits, freeze, hibernation refusals,
and nothing left on the host after a delete (including the access namespace)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandlot.config import Config
from sandlot.errors import Conflict, RuntimeFailure
from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState
from sandlot.runtime.oci import OciRuntime, hibernate, runsc
from sandlot.runtime.oci.layout import netns_name
from tests.conftest import BUNDLE_CACHE
from tests.runtime.helpers import (
    TEST_IMAGES,
    execd_client,
    leftovers,
    needs_root,
    short_tmpdir,
    spec,
    wait_ping,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def gvisor_data_dir() -> AsyncIterator[Path]:
    needs_root()
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed")
    d = short_tmpdir("slgv")
    BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
    (d / "execd-bundle").symlink_to(BUNDLE_CACHE)  # the machine-wide cache: not rebuilt here
    yield d  # type: ignore[misc]
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def gvisor(gvisor_data_dir: Path) -> AsyncIterator[OciRuntime]:
    cfg = Config.model_validate({"data_dir": str(gvisor_data_dir), "secure_runtime":
                                 {"type": "gvisor"}, "runtime": {"warm_pool_size": 0}})
    rt = await OciRuntime.open(cfg, images=TEST_IMAGES)
    try:
        yield rt
    finally:
        ids = await rt.list_ids()
        for sid in ids:
            await rt.delete(sid)
        await rt.close()
        left = {sid: what for sid in ids if (what := gone_check(rt, sid))}
        assert not left, left


def gone_check(rt: OciRuntime, sid: str) -> list[str]:
    """``leftovers`` plus what only gVisor sandboxes have (access netns, runsc state)."""
    found = leftovers(rt, sid)
    if Path("/run/netns", runsc.access_netns_name(netns_name(sid))).exists():
        found.append("access netns")
    if rt.runc.has_state(sid):
        found.append("runsc state")
    return found


async def sh(rt: OciRuntime, sid: str, command: str) -> tuple[int, str]:
    """Run a command through the sandbox's execd: exit code (0/1), output lines."""
    async with execd_client(rt, sid) as client:
        r = await client.post("/command", json={"command": command}, timeout=60)
    out, code = [], -1
    for line in r.text.splitlines():
        line = line.removeprefix("data: ").strip()
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event["type"] in ("stdout", "stderr"):
            out.append(event["text"].rstrip("\n"))
        elif event["type"] == "execution_complete":
            code = 0
        elif event["type"] == "error":
            code = 1
    return code, "".join(f"{text}\n" for text in out)


async def test_gvisor_sandbox_isolation_and_cleanup(gvisor: OciRuntime, rt_image: Image) -> None:
    assert gvisor.capabilities.hibernate and "gvisor" in gvisor.capabilities.isolation
    sid = "gv-iso"
    await gvisor.create(spec(sid, rt_image, memory_bytes=256 * MIB, pids_limit=64))
    await wait_ping(gvisor, sid)
    code, out = await sh(gvisor, sid, "uname -r; dmesg | head -1; hostname")
    assert code == 0 and out.splitlines()[0] == "4.4.0" and "gVisor" in out
    assert out.splitlines()[-1] == sid
    # writes reach the host's overlay (snapshots copy it): no gVisor overlay of its own
    code, _ = await sh(gvisor, sid, "echo kept > /workspace/written-inside")
    assert code == 0
    assert (gvisor.paths(sid).upper / "workspace" / "written-inside").read_text() == "kept\n"
    # no host processes or files: only the sandbox's own processes; the host's root is absent
    code, out = await sh(gvisor, sid, f"ls -d /proc/[0-9]* 2>/dev/null | wc -l; "
                                      f"test -e {gvisor.data_dir} && echo host-visible")
    assert int(out.split()[0]) < 10 and "host-visible" not in out
    # a port inside answers the host through the access namespace (netstack)
    await sh(gvisor, sid, "nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
    for _ in range(100):
        try:
            reader, writer = await asyncio.open_connection(sock=await gvisor.connect(sid, 8080))
            break
        except OSError:
            await asyncio.sleep(0.1)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.0 200")
    writer.close()
    # the memory limit holds: a 512 MiB allocation does not survive in a 256 MiB sandbox.
    # The host's OOM killer charges the gVisor sentry, so the whole sandbox ends with it.
    try:
        code, out = await sh(gvisor, sid, "python3 -c 'b = bytearray(512 << 20); "
                                          "b[::4096] = b\"x\" * len(b[::4096]); print(\"kept\")'")
    except httpx.HTTPError:
        out = ""
    assert "kept" not in out
    print("state after exceeding memory:", (await gvisor.inspect(sid)).state)
    await gvisor.delete(sid)
    assert not gone_check(gvisor, sid)


async def test_gvisor_freeze_and_refused_hibernation(gvisor: OciRuntime, rt_image: Image) -> None:
    sid = "gv-pause"
    await gvisor.create(spec(sid, rt_image, extensions={"sandlot.pause.mode": "hibernate"}))
    await wait_ping(gvisor, sid)
    # An asyncio server watches its TCP socket with epoll: this runsc cannot save that, so
    # hibernation is refused with the reason and the sandbox keeps running.
    await sh(gvisor, sid, "nohup python3 -c 'import asyncio\nasync def m():\n"
                          "  s = await asyncio.start_server(lambda r, w: None, \"0.0.0.0\", 8001)\n"
                          "  await s.serve_forever()\nasyncio.run(m())' >/dev/null 2>&1 &")
    for _ in range(100):
        code, out = await sh(gvisor, sid, "grep -c ':1F41 ' /proc/net/tcp || true")
        if out.strip() not in ("", "0"):
            break
        await asyncio.sleep(0.1)
    with pytest.raises(Conflict, match="epoll"):
        await gvisor.pause(sid)
    assert (await gvisor.inspect(sid)).state == ContainerState.RUNNING
    await wait_ping(gvisor, sid)
    code, out = await sh(gvisor, sid, "echo alive")
    assert code == 0 and out == "alive\n"


async def test_save_options_follow_the_installed_runsc(tmp_path: Path) -> None:
    """Hibernation passes the fastest flags the installed runsc lists, and only those."""
    binary = shutil.which("runsc")
    if binary is None:
        pytest.skip("runsc is not installed")
    options = await runsc.save_options(binary, tmp_path)
    listed = subprocess.run([binary, "help", "checkpoint"], capture_output=True, text=True,
                            check=True).stdout
    assert ("--compression=none" in options.checkpoint) == ("-compression" in listed)
    assert ("--direct" in options.checkpoint) == (
        "-direct" in listed and runsc.direct_io_works(tmp_path))
    assert options.version.startswith("runsc version ")
    platform = await runsc.resolve_platform(binary, "auto")
    platforms = subprocess.run([binary, "help", "platforms"], capture_output=True, text=True,
                               check=True).stdout.split()
    assert platform == ("systrap" if "systrap" in platforms else "ptrace")
    with pytest.raises(RuntimeFailure, match="offers only"):
        await runsc.resolve_platform(binary, "no-such-platform")


async def test_gvisor_pids_limit_holds(gvisor: OciRuntime, rt_image: Image) -> None:
    """A fork bomb meets the host pids limit of the sandbox's cgroup (gVisor's threads are
    what the host counts): it never gets its 300 processes, and the host is unaffected."""
    sid = "gv-pids"
    await gvisor.create(spec(sid, rt_image, pids_limit=16))
    await wait_ping(gvisor, sid)
    bomb = ("python3 -c 'import os, time\nn = 0\nfor i in range(300):\n  try:\n"
            "    pid = os.fork()\n  except OSError:\n    break\n  if pid == 0:\n"
            "    time.sleep(60); os._exit(0)\n  n += 1\nprint(\"forked\", n)'")
    try:
        code, out = await sh(gvisor, sid, bomb)
    except httpx.HTTPError:  # the sentry could not make its threads: the sandbox ended
        out = ""
    assert "forked 300" not in out
    await gvisor.delete(sid)
    assert not gone_check(gvisor, sid)


async def test_gvisor_warm_claim_hibernates_with_its_limits(
    gvisor_data_dir: Path, rt_image: Image
) -> None:
    """A create claims a warm gVisor container; hibernating and restoring it keeps the
    process and the claimed memory limit (a restore re-creates cgroups from config.json)."""
    cfg = Config.model_validate({
        "data_dir": str(gvisor_data_dir), "secure_runtime": {"type": "gvisor"},
        "runtime": {"warm_pool_size": 1, "warm_pool_images": [rt_image.name],
                    "pause_mode": "hibernate"}})
    rt = await OciRuntime.open(cfg, images=TEST_IMAGES)
    sid = "gv-warm"
    try:
        await rt.prewarm(TEST_IMAGES.add(rt_image))
        await rt.pool.wait_full(rt_image.name, timeout=120)
        created = await rt.create(spec(sid, rt_image, memory_bytes=512 * MIB))
        assert created.execd_ready  # a claimed warm container
        cid = rt.container_id(sid)
        assert cid != sid
        await sh(rt, sid, "nohup sleep 600 >/dev/null 2>&1 &")
        code, before = await sh(rt, sid, "pgrep -x sleep")
        assert code == 0
        await rt.pause(sid)
        info = await rt.inspect(sid)  # at once: gVisor 2024's sentry may still be exiting
        assert info.state == ContainerState.PAUSED and info.reason == "hibernated"
        # an image another runsc build wrote is refused with the reason, and kept
        written_by = rt.paths(sid).root / "hibernate" / hibernate.VERSION_FILE
        version = written_by.read_text()
        written_by.write_text("runsc version 0.0~19991231.0\n")
        with pytest.raises(Conflict, match="hibernated by 'runsc version 0.0~19991231.0'"):
            await rt.resume(sid)
        assert (await rt.inspect(sid)).reason == "hibernated"
        written_by.write_text(version)
        await rt.resume(sid)
        assert (await rt.inspect(sid)).state == ContainerState.RUNNING
        code, after = await sh(rt, sid, "pgrep -x sleep")
        assert after == before  # the same process, restored
        limit = Path(f"/sys/fs/cgroup/memory/sandlot/{cid}/memory.limit_in_bytes")
        if limit.parent.is_dir():
            assert int(limit.read_text()) == 512 * MIB
    finally:
        for s in await rt.list_ids():
            await rt.delete(s)
        await rt.close()
        assert not gone_check(rt, sid)
