"""OciRuntime volumes and disk caps at the runtime boundary: what the API tests cannot see.

A warm pool made with ``[runtime] default_ephemeral_storage`` serves capped creates as claims;
a failed create leaves no mount, loop device or pvc claim; delete never removes a volume's
files; a link planted in a host path after the server's check is refused at mount time.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.errors import InvalidRequest, RuntimeFailure
from sandlot.images.model import Image
from sandlot.runtime.base import VolumeSpec
from sandlot.runtime.oci import OciRuntime, disklimit
from sandlot.runtime.oci import mounts as m
from sandlot.runtime.oci.pool import is_pool_id
from tests.runtime.helpers import TEST_IMAGES, leftovers, runc_exec, spec, wait_ping

CAP = 48 * 2**20


def _loops_of(data_dir: Path) -> list[str]:
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if str(data_dir) in ln]


@pytest.fixture
async def capped_rt(runtime_data_dir: Path, rt_image: Image,
                    tmp_path: Path) -> AsyncIterator[OciRuntime]:
    cfg = Config(data_dir=runtime_data_dir)
    cfg.runtime.warm_pool_size = 1
    cfg.runtime.default_ephemeral_storage = "48Mi"
    cfg.storage.allowed_host_paths = [str(tmp_path)]
    rt = await OciRuntime.open(cfg, images=TEST_IMAGES)
    try:
        yield rt
    finally:
        ids = await rt.list_ids()
        for sid in ids:
            await rt.delete(sid)
        await rt.close()
        assert not [c for c in rt._container_ids() if is_pool_id(c)]
        assert not {sid: w for sid in ids if (w := leftovers(rt, sid))}
        assert not _loops_of(runtime_data_dir), "loop devices leaked"


async def test_warm_pool_holds_the_default_cap(capped_rt: OciRuntime, rt_image: Image) -> None:
    rt = capped_rt
    await rt.prewarm(TEST_IMAGES.add(rt_image))
    await rt.pool.wait_full(rt_image.name)
    warm = rt.pool._ready[rt_image.name][0].container_id
    assert m.is_mounted(rt.paths(warm).rw)  # the warm container's layer is capped already
    device = disklimit.source_of(rt.paths(warm).rw)
    assert device is not None and device.startswith("/dev/loop")
    dio = Path(f"/sys/block/{Path(device).name}/loop/dio").read_text().strip()
    assert dio == "1"  # no second page-cache copy of the layer's blocks
    await rt.create(spec("dflt", rt_image, disk_bytes=CAP))
    assert rt.container_id("dflt") == warm  # served from the pool
    await rt.create(spec("other-size", rt_image, disk_bytes=2 * CAP))
    assert rt.container_id("other-size") == "other-size"  # a cold create of its own size
    await wait_ping(rt, "other-size")
    for sid, cap_mb in (("dflt", 48), ("other-size", 96)):
        cid = rt.container_id(sid)
        r = runc_exec(rt, cid, "df -m / | tail -1; dd if=/dev/zero of=/workspace/f bs=1M "
                               "count=200 2>&1; echo rc=$?")
        size = int(r.stdout.splitlines()[0].split()[1])
        assert cap_mb * 0.75 < size <= cap_mb, r.stdout
        assert "No space left on device" in r.stdout and "rc=1" in r.stdout, r.stdout


async def test_delete_keeps_volume_files_and_failures_leave_nothing(
        capped_rt: OciRuntime, rt_image: Image, tmp_path: Path) -> None:
    rt = capped_rt
    host = tmp_path / "host-dir"
    vols = [VolumeSpec(name="h", kind="host", source=str(host), mount_path="/h"),
            VolumeSpec(name="p", kind="pvc", source="tmp-claim", mount_path="/p",
                       options={"deleteOnSandboxTermination": True})]
    await rt.create(spec("withvols", rt_image, volumes=vols, disk_bytes=CAP))
    await wait_ping(rt, "withvols")
    r = runc_exec(rt, "withvols", "echo keep > /h/f && echo tmp > /p/f && echo ok")
    assert r.stdout.strip() == "ok", r.stderr
    assert rt.pvcs.users("tmp-claim") == {"withvols"}
    await rt.delete("withvols")
    assert (host / "f").read_text() == "keep\n"
    assert not rt.pvcs.exists("tmp-claim")
    assert not leftovers(rt, "withvols")

    # the second volume's source is a link out planted after the server's request checks:
    # the runtime checks again when it mounts, and undoes the first volume's claim and mount
    (tmp_path / "planted").symlink_to("/etc")
    bad = [VolumeSpec(name="p", kind="pvc", source="half-made", mount_path="/p",
                      options={"deleteOnSandboxTermination": True}),
           VolumeSpec(name="h", kind="host", source=str(tmp_path / "planted"),
                      mount_path="/h")]
    with pytest.raises((InvalidRequest, RuntimeFailure)):
        await rt.create(spec("badvols", rt_image, volumes=bad, disk_bytes=CAP))
    assert not leftovers(rt, "badvols")
    assert not rt.pvcs.exists("half-made")
    assert not _loops_of(rt.data_dir / "sandboxes" / "badvols")
