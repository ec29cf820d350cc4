"""Volumes and the disk cap (issue 13, parts 1 and 5) through the released SDK and ``osb``.

One ``sandlot serve`` per backend (oci, docker) with ``[storage] allowed_host_paths`` set to a
directory of the test's own; host volumes, pvc volumes shared by two sandboxes, and
``ephemeral-storage`` (501 on docker, which cannot cap a container's writable layer here).
pvc claims are directories in the data dir on oci and named volumes of the test's private
dockerd on docker; claim names carry a per-run suffix (that dockerd's data root is kept).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound as DockerNotFound
from opensandbox import Sandbox
from opensandbox.models.sandboxes import PVC, Host, Volume

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, _new_server

pytestmark = pytest.mark.backends("oci", "docker", "runsc")
RUN = secrets.token_hex(3)  # claim names of this run (the test dockerd keeps its volumes)


def _claim(name: str) -> str:
    return f"{name}-{RUN}"


def _claim_dir(server: SandlotServer, claim: str) -> Path | None:
    """Where a pvc's files are on the host; None when the claim does not exist."""
    if server.docker is None:
        data = server.data_dir / "volumes" / claim / "data"
        return data if data.is_dir() else None
    client = docker.DockerClient(base_url=server.docker.host)
    try:
        return Path(client.api.inspect_volume(claim)["Mountpoint"])
    except DockerNotFound:
        return None
    finally:
        client.close()


@pytest.fixture(scope="module")
def allowed_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="slv-allowed-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def vol_server(request: pytest.FixtureRequest, compat_image_root: Path, allowed_dir: Path,
               compat_backend: str) -> Iterator[SandlotServer]:
    server = _new_server(request, compat_image_root, compat_backend)
    with server.config.open("a") as fh:
        fh.write(f'[storage]\nallowed_host_paths = ["{allowed_dir}"]\n')
    server.start()
    try:
        yield server
    finally:
        server.destroy()


async def _create(server: SandlotServer, **kw: object) -> Sandbox:
    return await Sandbox.create(
        COMPAT_IMAGE, connection_config=server.sdk_config(),
        timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=90), **kw,  # type: ignore[arg-type]
    )


async def _sh(sandbox: Sandbox, cmd: str) -> tuple[str, str]:
    ex = await sandbox.commands.run(cmd)
    # one event per line of output (with or without its newline, by execd version)
    out = "\n".join(m.text.rstrip("\n") for m in ex.logs.stdout)
    err = "\n".join(m.text.rstrip("\n") for m in ex.logs.stderr)
    return out.strip(), err.strip()


async def test_host_volume_read_write_and_read_only(vol_server: SandlotServer,
                                                    allowed_dir: Path) -> None:
    src = allowed_dir / f"checkout-{vol_server.backend}"
    src.mkdir()
    (src / "README").write_text("from the host\n")
    sandbox = await _create(vol_server, volumes=[
        Volume(name="code", host=Host(path=str(src)), mount_path="/mnt/code"),
        Volume(name="code-ro", host=Host(path=str(src)), mount_path="/mnt/ro", read_only=True),
    ])
    try:
        out, _ = await _sh(sandbox, "cat /mnt/code/README; echo made > /mnt/code/new; "
                                    "echo x > /mnt/ro/nope || echo refused")
        assert "from the host" in out and "refused" in out
        assert (src / "new").read_text() == "made\n"
        assert not (src / "nope").exists()
        # root in the sandbox writes as the directory's owner, here host root (in a user
        # namespace the volume is idmapped: docs/volumes.md, "File ownership")
        assert (src / "new").stat().st_uid == 0
        out, _ = await _sh(sandbox, "cat /mnt/ro/new")
        assert out == "made"
        # no set-uid programs or device nodes come in through a volume (gVisor's own mount
        # table shows its 9p mount without the flags: docs/volumes.md)
        out, _ = await _sh(sandbox, "grep ' /mnt/code ' /proc/mounts")
        if vol_server.backend != "runsc":
            assert {"nosuid", "nodev"} <= set(out.split()[3].split(",")), out
    finally:
        await sandbox.kill()
        await sandbox.close()
    assert (src / "new").exists()  # a host volume outlives the sandbox
    assert not any(str(src) in line for line in Path("/proc/self/mountinfo").read_text()
                   .splitlines()), "a staged volume mount leaked"
    assert not list((vol_server.data_dir / "docker-volumes").glob("*")), "staging leaked"


def _host_disk() -> int:
    """The device number of a real block device of this host (not a loop or RAM disk)."""
    for dev in sorted(Path("/sys/block").iterdir()):
        if not dev.name.startswith(("loop", "ram", "zram")):
            major, minor = (dev / "dev").read_text().split(":")
            return os.makedev(int(major), int(minor))
    pytest.skip("this host has no block device")


async def test_volume_brings_in_no_set_uid_or_device(vol_server: SandlotServer,
                                                      allowed_dir: Path) -> None:
    """What nosuid/nodev are for holds on every backend, gVisor included (runsc ignores the
    flags in its own mount table; docs/volumes.md): a set-uid-root program put in a host
    volume does not raise a sandbox user to root, a device node of the host's disk put there
    reads nothing, and no device node can be made in the volume from inside."""
    src = allowed_dir / f"suid-{vol_server.backend}"
    src.mkdir()
    shutil.copy2("/usr/bin/id", src / "id")  # the same Debian binary the base image runs
    os.chown(src / "id", 0, 0)
    os.chmod(src / "id", 0o4755)
    os.mknod(src / "disk", 0o666 | stat.S_IFBLK, _host_disk())  # the host's own disk
    sandbox = await _create(vol_server, volumes=[
        Volume(name="v", host=Host(path=str(src)), mount_path="/mnt/v")])
    try:
        as_nobody = ("import os; os.setgroups([]); os.setgid(65534); os.setuid(65534); "
                     "os.execv('/mnt/v/id', ['id', '-u'])")
        out, err = await _sh(sandbox, f'python3 -c "{as_nobody}"')
        assert out == "65534", (out, err)  # not 0: the set-uid bit is inert
        out, err = await _sh(sandbox, "head -c512 /mnt/v/disk 2>/dev/null | wc -c")
        assert out == "0", (out, err)  # the host's disk cannot be read through the node
        out, err = await _sh(sandbox, "mknod /mnt/v/made c 1 3 2>&1 && echo made || "
                                      "echo refused")
        assert out.splitlines()[-1] == "refused", (out, err)
        assert not (src / "made").exists()
    finally:
        await sandbox.kill()
        await sandbox.close()


@pytest.mark.parametrize(("path", "code"), [
    ("/etc", "VOLUME::HOST_PATH_NOT_ALLOWED"),
    ("{allowed}/../etc", "VOLUME::INVALID_HOST_PATH"),
    ("{allowed}/link-out", "VOLUME::HOST_PATH_NOT_ALLOWED"),
])
def test_host_volume_outside_is_refused(vol_server: SandlotServer, allowed_dir: Path,
                                        path: str, code: str) -> None:
    link = allowed_dir / "link-out"
    if not link.is_symlink():
        link.symlink_to("/etc")
    host_path = path.format(allowed=allowed_dir)
    body = {"image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 60, "resourceLimits": {},
            "volumes": [{"name": "x", "host": {"path": host_path}, "mountPath": "/mnt/x"}]}
    with vol_server.client() as c:
        before = {i["id"] for i in c.get("/v1/sandboxes").json()["items"]}
        r = c.post("/v1/sandboxes", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == code and host_path.split("/")[-1] in r.json()["message"]
        assert {i["id"] for i in c.get("/v1/sandboxes").json()["items"]} == before


def test_other_bad_volumes(vol_server: SandlotServer, allowed_dir: Path) -> None:
    cases = [
        ({"name": "o", "ossfs": {"bucket": "b", "endpoint": "e"}, "mountPath": "/m"}, 501,
         "VOLUME::UNSUPPORTED_BACKEND"),
        ({"name": "p", "pvc": {"claimName": _claim("never-made"), "createIfNotExists": False},
          "mountPath": "/m"}, 400, "VOLUME::PVC_NOT_FOUND"),
        ({"name": "p", "pvc": {"claimName": _claim("x")}, "mountPath": "/m",
          "subPath": "../up"}, 400,
         "VOLUME::INVALID_SUB_PATH"),
        ({"name": "p", "pvc": {"claimName": "x"}, "mountPath": "/proc/x"}, 400,
         "VOLUME::INVALID_MOUNT_PATH"),
        ({"name": "Bad_Name", "pvc": {"claimName": "x"}, "mountPath": "/m"}, 400,
         "VOLUME::INVALID_NAME"),
    ]
    with vol_server.client() as c:
        for vol, status, code in cases:
            r = c.post("/v1/sandboxes", json={
                "image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
                "timeout": 60, "resourceLimits": {}, "volumes": [vol]})
            assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert _claim_dir(vol_server, _claim("x")) is None


async def test_pvc_shared_then_removed(vol_server: SandlotServer) -> None:
    vols = [Volume(name="cache", mount_path="/cache",
                   pvc=PVC(claim_name=_claim("shared-cache"),
                           delete_on_sandbox_termination=True))]
    first = await _create(vol_server, volumes=vols)
    try:
        out, err = await _sh(first, "mkdir -p /cache/pkgs && echo 42 > /cache/pkgs/answer "
                                    "&& chmod 600 /cache/pkgs/answer && echo ok")
        assert out == "ok", err
        second = await _create(vol_server, volumes=[Volume(
            name="c", mount_path="/data", read_only=True, sub_path="pkgs",
            pvc=PVC(claim_name=_claim("shared-cache"), create_if_not_exists=False))])
        try:
            out, _ = await _sh(second, "cat /data/answer; touch /data/x || echo read-only")
            assert out.splitlines() == ["42", "read-only"]
        finally:
            await second.kill()
            await second.close()
        assert _claim_dir(vol_server, _claim("shared-cache"))  # the first sandbox uses it
    finally:
        await first.kill()
        await first.close()
    # its last user ended and the creating request asked for it
    assert _claim_dir(vol_server, _claim("shared-cache")) is None


async def test_pvc_kept_without_delete_flag(vol_server: SandlotServer) -> None:
    vols = [Volume(name="keep", mount_path="/keep", pvc=PVC(claim_name=_claim("kept")))]
    sandbox = await _create(vol_server, volumes=vols)
    try:
        await _sh(sandbox, "echo persisted > /keep/f; ln -s / /keep/evil; mkdir /keep/ok")
    finally:
        await sandbox.kill()
        await sandbox.close()
    data = _claim_dir(vol_server, _claim("kept"))
    assert data is not None and (data / "f").read_text() == "persisted\n"
    # a link the workload left in the volume cannot carry a later subPath out of it
    with vol_server.client() as c:
        r = c.post("/v1/sandboxes", json={
            "image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 60, "resourceLimits": {},
            "volumes": [{"name": "k", "pvc": {"claimName": _claim("kept")}, "mountPath": "/k",
                         "subPath": "evil/etc"}]})
        assert (r.status_code, r.json()["code"]) == (400, "VOLUME::INVALID_SUB_PATH"), r.text
        assert "symbolic link" in r.json()["message"]
        assert str(vol_server.data_dir) not in r.json()["message"]
    later = await _create(vol_server, volumes=vols)
    try:
        out, _ = await _sh(later, "cat /keep/f")
        assert out == "persisted"
    finally:
        await later.kill()
        await later.close()


async def test_ephemeral_storage_gives_enospc(vol_server: SandlotServer) -> None:
    if vol_server.backend == "docker":
        with vol_server.client() as c:  # refused, never run uncapped
            r = c.post("/v1/sandboxes", json={
                "image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
                "timeout": 60, "resourceLimits": {"ephemeral-storage": "64Mi"}})
            assert r.status_code == 501 and "ephemeral-storage" in r.json()["message"], r.text
        return
    capped = await _create(vol_server, resource={"cpu": "1", "memory": "512Mi",
                                                 "ephemeral-storage": "64Mi"})
    other = await _create(vol_server)
    try:
        out, err = await _sh(capped, "dd if=/dev/zero of=/workspace/fill bs=1M count=200 "
                                     "2>&1; echo rc=$?")
        assert "No space left on device" in out + err and "rc=1" in out, (out, err)
        out, _ = await _sh(capped, "du -m /workspace/fill | cut -f1")
        assert int(out) <= 64
        # the host gave the sandbox's layer at most the cap, and another sandbox still writes
        image = vol_server.data_dir / "sandboxes" / capped.id / "rw.img"
        assert 0 < image.stat().st_blocks * 512 <= 64 * 2**20
        out, err = await _sh(other, "dd if=/dev/zero of=/workspace/f bs=1M count=100 "
                                    "2>/dev/null && echo wrote")
        assert out == "wrote", err
    finally:
        for s in (capped, other):
            await s.kill()
            await s.close()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert f"{vol_server.data_dir}/sandboxes/{capped.id}/" not in loops, loops


async def test_pvc_storage_size_gives_enospc(vol_server: SandlotServer) -> None:
    """A pvc made with ``storage`` is capped there (its own file system on oci/runsc); the
    docker runtime refuses the size (501) rather than making an uncapped volume."""
    claim = _claim("sized")
    body = {"image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 60, "resourceLimits": {},
            "volumes": [{"name": "s", "mountPath": "/s", "pvc": {
                "claimName": claim, "storage": "32Mi", "deleteOnSandboxTermination": True}}]}
    if vol_server.backend == "docker":
        with vol_server.client() as c:
            r = c.post("/v1/sandboxes", json=body)
            assert (r.status_code, r.json()["code"]) == (501, "VOLUME::UNSUPPORTED_BACKEND")
            assert "storage" in r.json()["message"] and "docker" in r.json()["message"]
        assert _claim_dir(vol_server, claim) is None
        return
    vols = [Volume(name="s", mount_path="/s", pvc=PVC(
        claim_name=claim, storage="32Mi", delete_on_sandbox_termination=True))]
    sized = await _create(vol_server, volumes=vols)
    other = await _create(vol_server, volumes=[Volume(name="o", mount_path="/o", pvc=PVC(
        claim_name=_claim("unsized"), delete_on_sandbox_termination=True))])
    try:
        out, err = await _sh(sized, "dd if=/dev/zero of=/s/fill bs=1M count=100 2>&1; "
                                    "echo rc=$?; df -m /s | tail -1")
        assert "No space left on device" in out + err and "rc=1" in out, (out, err)
        assert int(out.splitlines()[-1].split()[1]) <= 32, out
        data = _claim_dir(vol_server, claim)
        assert data is not None and (data / "fill").stat().st_size <= 32 * 2**20
        image = vol_server.data_dir / "volumes" / claim / "disk.img"
        assert 0 < image.stat().st_blocks * 512 <= 32 * 2**20  # the host gave at most the size
        out, err = await _sh(other, "dd if=/dev/zero of=/o/f bs=1M count=64 2>/dev/null "
                                    "&& echo wrote")
        assert out == "wrote", err  # another volume is not capped by this one
        with vol_server.client() as c:  # an existing claim is not resized
            body["volumes"][0]["pvc"]["storage"] = "64Mi"  # type: ignore[index]
            r = c.post("/v1/sandboxes", json=body)
            assert (r.status_code, r.json()["code"]) == (409, "VOLUME::PVC_SIZE_MISMATCH"), r.text
    finally:
        for s in (sized, other):
            await s.kill()
            await s.close()
    assert _claim_dir(vol_server, claim) is None
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert f"{vol_server.data_dir}/volumes/" not in loops, loops
    mounted = Path("/proc/self/mountinfo").read_text()
    assert f"{vol_server.data_dir}/volumes/" not in mounted


def test_osb_creates_with_a_volume_and_a_disk_cap(vol_server: SandlotServer,
                                                  allowed_dir: Path) -> None:
    """``osb sandbox create --volumes-file ... --resource ephemeral-storage=...``."""
    from tests.compat.test_osb_cli import ok_json, osb

    src = allowed_dir / f"osb-{vol_server.backend}"
    src.mkdir()
    capped = vol_server.backend != "docker"  # docker: no ephemeral-storage (501)
    vols = vol_server.data_dir / "osb-volumes.json"
    vols.write_text(json.dumps([{"name": "w", "host": {"path": str(src)},
                                 "mountPath": "/mnt/w"}]))
    created = ok_json(vol_server, "sandbox", "create", "-i", COMPAT_IMAGE, "-t", "10m",
                      "--volumes-file", str(vols),
                      *(["--resource", "ephemeral-storage=48Mi"] if capped else []))
    assert isinstance(created, dict)
    sid = created["id"]
    try:
        run = osb(vol_server, "command", "run", sid, "--", "sh", "-c",
                  "echo via-osb > /mnt/w/f; df -m / | tail -1")
        assert run.returncode == 0, run.stderr
        assert (src / "f").read_text() == "via-osb\n"
        size_mb = int(run.stdout.split()[1])  # the root's size is the cap, not the host's
        assert (30 < size_mb <= 48) if capped else size_mb > 48, run.stdout
    finally:
        osb(vol_server, "sandbox", "kill", sid)


async def test_pvc_use_survives_a_server_restart(vol_server: SandlotServer) -> None:
    """Who uses a claim is on disk: after a kill -9 and a restart, the last delete still
    removes a claim that asked for it."""
    sandbox = await _create(vol_server, volumes=[Volume(
        name="r", mount_path="/r",
        pvc=PVC(claim_name=_claim("across-restart"), delete_on_sandbox_termination=True))])
    try:
        await _sh(sandbox, "echo before > /r/f")
        vol_server.kill9()
        vol_server.start()
        again = await Sandbox.connect(sandbox.id, connection_config=vol_server.sdk_config())
        try:
            out, _ = await _sh(again, "cat /r/f")
            assert out == "before"
        finally:
            await again.close()
        assert _claim_dir(vol_server, _claim("across-restart"))
    finally:
        await sandbox.kill()
        await sandbox.close()
    assert _claim_dir(vol_server, _claim("across-restart")) is None
