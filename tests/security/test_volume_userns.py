"""Volumes of a user-namespaced sandbox (issue 11): root inside stays an unprivileged host uid.

Before, a sandbox created with ``volumes`` ran without a user namespace: its root was host
root, and could rewrite any root-owned host file it reached through a volume (a file in a
shared checkout, a hard link to a system file). Now each volume is an idmapped bind: the
sandbox's root acts there as the owner of the bound directory (docs/volumes.md "File
ownership"), on-disk root is nobody inside unless it owns the directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.images.model import Image
from sandlot.runtime.base import VolumeSpec
from sandlot.runtime.oci import OciRuntime
from sandlot.runtime.oci.idmap import owner_mapping
from sandlot.runtime.oci.uidrange import FIRST_BASE
from tests.runtime.helpers import leftovers, runc_exec, short_tmpdir, spec, wait_ping

OWNER = 4242  # a host user's checkout (no account needed: only the numeric owner matters)


@pytest.fixture
def shared_tree() -> Iterator[Path]:
    """``allowed/checkout`` owned by OWNER with a root-owned file and a hard link to a
    root-owned file outside the allowed directory; ``allowed/rootdir`` owned by root."""
    top = short_tmpdir("slvu")
    os.chmod(top, 0o755)
    allowed, outside = top / "allowed", top / "outside"
    for d in (allowed, outside):
        d.mkdir(mode=0o755)
    checkout = allowed / "checkout"
    checkout.mkdir(mode=0o755)
    (checkout / "mine").write_text("owner's\n")
    os.chown(checkout / "mine", OWNER, OWNER)
    (checkout / "roots").write_text("root's\n")  # 0644 root:root
    (outside / "secret").write_text("host root's\n")
    os.link(outside / "secret", checkout / "hardlink")
    os.chown(checkout, OWNER, OWNER)
    (allowed / "rootdir").mkdir(mode=0o755)
    (allowed / "rootdir" / "config").write_text("root's\n")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


async def test_root_in_a_volume_sandbox_is_unprivileged_and_acts_as_the_volume_owner(
    oci_runtime: OciRuntime, rt_image: Image, shared_tree: Path
) -> None:
    rt = oci_runtime
    assert rt.user_namespaces, "this kernel supports idmapped mounts: user namespaces are on"
    allowed = shared_tree / "allowed"
    rt.allowed_host_paths = [str(allowed)]
    vols = [
        VolumeSpec("code", "host", str(allowed / "checkout"), "/mnt/code"),
        VolumeSpec("etc", "host", str(allowed / "rootdir"), "/mnt/rootdir"),
        VolumeSpec("etcro", "host", str(allowed / "rootdir"), "/mnt/rootro", read_only=True),
        VolumeSpec("data", "pvc", "vu-claim", "/mnt/pvc",
                   options={"deleteOnSandboxTermination": True}),
    ]
    sid = "volusr"
    await rt.create(spec(sid, rt_image, volumes=vols))
    await wait_ping(rt, sid)

    # root inside is an unprivileged host uid of the sandbox's own range
    pid = (await rt.inspect(sid)).pid
    assert pid is not None
    host_uid = os.stat(f"/proc/{pid}").st_uid
    assert host_uid >= FIRST_BASE
    r = runc_exec(rt, sid, "id -u; stat -c %u:%g /mnt/code /mnt/code/mine /mnt/code/roots "
                           "/mnt/code/hardlink")
    assert r.returncode == 0, r
    lines = r.stdout.split()
    assert lines[0] == "0"
    # the checkout's owner is root inside; host root's files are nobody (overflow id)
    assert lines[1:] == ["0:0", "0:0", "65534:65534", "65534:65534"], lines

    # root inside writes what the checkout's owner may write, and nothing of host root's
    r = runc_exec(rt, sid, "echo more >> /mnt/code/mine && echo ok-mine; "
                           "echo evil >> /mnt/code/roots || echo refused-roots; "
                           "echo evil >> /mnt/code/hardlink || echo refused-hardlink; "
                           "chown 0 /mnt/code/roots || echo refused-chown; "
                           "echo new > /mnt/code/made && chmod 4755 /mnt/code/made && echo ok")
    assert r.returncode == 0, r
    assert r.stdout.split() == ["ok-mine", "refused-roots", "refused-hardlink",
                                "refused-chown", "ok"], r
    checkout = allowed / "checkout"
    assert (checkout / "mine").read_text() == "owner's\nmore\n"
    assert (checkout / "roots").read_text() == "root's\n"
    assert (shared_tree / "outside" / "secret").read_text() == "host root's\n"
    made = (checkout / "made").stat()
    # a file root writes in the volume is the owner's on the host: a set-uid bit on it can
    # never make a host-root program
    assert (made.st_uid, made.st_gid) == (OWNER, OWNER)

    # a root-owned directory: root inside is host root there (intended: the admin allowed
    # it); the same directory read-only refuses writes
    r = runc_exec(rt, sid, "echo changed >> /mnt/rootdir/config && echo ok-rootdir; "
                           "echo x > /mnt/rootro/new || echo refused-ro; "
                           "echo p > /mnt/pvc/file && echo ok-pvc")
    assert r.stdout.split() == ["ok-rootdir", "refused-ro", "ok-pvc"], r
    assert (allowed / "rootdir" / "config").read_text() == "root's\nchanged\n"
    assert not (allowed / "rootdir" / "new").exists()
    pvc_file = rt.pvcs.data_dir("vu-claim") / "file"
    assert pvc_file.stat().st_uid == 0  # pvc directories are root's: files stay root's

    # the volumes are nosuid,nodev inside
    r = runc_exec(rt, sid, "grep ' /mnt/code ' /proc/mounts")
    assert {"nosuid", "nodev"} <= set(r.stdout.split()[3].split(",")), r

    await rt.delete(sid)
    assert leftovers(rt, sid) == []
    assert (checkout / "mine").exists() and (checkout / "made").exists()  # never deleted


@pytest.mark.parametrize("owner", [0, 1, 1000, 65534, 65535, 70000])
def test_owner_mapping_is_one_to_one_and_never_maps_host_root_unless_it_owns(owner: int) -> None:
    base, count = FIRST_BASE, 65536
    lines = owner_mapping(base, owner, count)
    inside = [i + k for i, _, n in lines for k in range(n)]
    outside = [o + k for _, o, n in lines for k in range(n)]
    assert len(set(inside)) == len(inside) and len(set(outside)) == len(outside)
    assert (owner, base) in {(i, o) for i, o, _ in lines}  # the owner is the sandbox's root
    assert all(base <= o < base + count for o in outside)  # only the sandbox's own range
    assert (0 in inside) == (owner == 0)  # host root is nobody inside unless it owns the dir
