"""Importing archives: `docker save` format, OCI archives, plain rootfs tarballs."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandlot.errors import InvalidRequest
from sandlot.images.store import ImageStore, archive_kind
from sandlot.images.unpack import UnsafeArchiveError
from tests.images.oci_util import TarBuilder, write_oci_layout

CONFIG = {"Env": ["PATH=/bin", "MODE=imported"], "Cmd": ["/bin/app"], "WorkingDir": "/work"}


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    lower = TarBuilder().dir("bin").file("bin/app", b"#!/bin/sh\n", mode=0o755).file("gone", b"x")
    upper = TarBuilder().file(".wh.gone").dir("work").file("work/data", b"d", uid=7, gid=8)
    path = tmp_path / "layout"
    write_oci_layout(path, [lower.bytes(), upper.bytes()], config=CONFIG)
    return path


def skopeo_copy(src: str, dest: str) -> None:
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet", src, dest],
        check=True,
        capture_output=True,
    )


def check_imported(store: ImageStore, name: str) -> None:
    img = store.get(name)
    assert img is not None
    root = img.lower_dirs[0]
    assert (root / "bin/app").stat().st_mode & 0o777 == 0o755
    assert not (root / "gone").exists()
    assert (root / "work/data").stat().st_uid == 7
    assert img.config.env == CONFIG["Env"] and img.config.cmd == ["/bin/app"]
    assert img.config.working_dir == "/work"
    assert os.listdir(store.root / "tmp") == []


async def test_import_docker_save_archive(store: ImageStore, layout: Path, tmp_path: Path) -> None:
    archive = tmp_path / "saved.tar"
    skopeo_copy(f"oci:{layout}:latest", f"docker-archive:{archive}:tests/app:1")
    assert archive_kind(archive) == "docker"
    await store.import_tar(archive, "imported/docker:1")
    check_imported(store, "imported/docker:1")


async def test_import_oci_archive(store: ImageStore, layout: Path, tmp_path: Path) -> None:
    archive = tmp_path / "oci.tar"
    skopeo_copy(f"oci:{layout}:latest", f"oci-archive:{archive}")
    assert archive_kind(archive) == "oci"
    await store.import_tar(archive, "imported/oci:1")
    check_imported(store, "imported/oci:1")


async def test_import_plain_rootfs_tarball(store: ImageStore, tmp_path: Path) -> None:
    archive = tmp_path / "rootfs.tar.gz"
    data = TarBuilder().dir("bin").file("bin/sh", b"elf", mode=0o755).dir("dev")
    data = data.device("dev/null", 1, 3).symlink("lib", "usr/lib").file("etc/passwd", b"root")
    raw = tmp_path / "rootfs.tar"
    raw.write_bytes(data.bytes())
    with tarfile.open(archive, "w:gz") as tf:
        with tarfile.open(raw) as src:
            for m in src:
                tf.addfile(m, src.extractfile(m) if m.isreg() else None)
    assert archive_kind(archive) == "rootfs"
    img = await store.import_tar(archive, "my-rootfs")
    root = img.lower_dirs[0]
    assert (root / "bin/sh").read_bytes() == b"elf"
    assert os.readlink(root / "lib") == "usr/lib"
    assert os.listdir(root / "dev") == []  # no device nodes
    assert store.get("docker.io/library/my-rootfs:latest") == img
    assert any(e.startswith("PATH=") for e in img.config.env)


async def test_malicious_rootfs_tarball_leaves_nothing(store: ImageStore, tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    archive.write_bytes(TarBuilder().file("ok", b"1").file("../../evil", b"x").bytes())
    with pytest.raises(UnsafeArchiveError):
        await store.import_tar(archive, "evil")
    assert store.get("evil") is None
    assert os.listdir(store.root / "tmp") == [] and os.listdir(store.root / "rootfs") == []


async def test_import_rejects_bad_name_and_non_tar(store: ImageStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"definitely not a tarball" * 100)
    with pytest.raises(InvalidRequest):
        await store.import_tar(junk, "junk")
    with pytest.raises(InvalidRequest):
        await store.import_tar(junk, "Bad Name!")
