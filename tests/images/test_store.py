"""ImageStore bookkeeping: names, tags, removal, sharing between store instances."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from sandlot.errors import Conflict, InvalidRequest, NotFound
from sandlot.images.model import ImageConfig
from sandlot.images.reference import parse_reference
from sandlot.images.store import ImageStore
from sandlot.images.unpack import apply_layer
from tests.images.oci_util import TarBuilder


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("python:3.12", "docker.io/library/python:3.12"),
        ("python", "docker.io/library/python:latest"),
        ("docker.io/library/python:3.12", "docker.io/library/python:3.12"),
        ("index.docker.io/library/python", "docker.io/library/python:latest"),
        ("user/app:v1", "docker.io/user/app:v1"),
        ("127.0.0.1:5000/python:3.12", "127.0.0.1:5000/python:3.12"),
        ("localhost/team/app", "localhost/team/app:latest"),
        ("ghcr.io/o/r@sha256:" + "a" * 64, "ghcr.io/o/r@sha256:" + "a" * 64),
    ],
)
def test_reference_normalization(given: str, canonical: str) -> None:
    assert parse_reference(given).canonical == canonical


@pytest.mark.parametrize("bad", ["", "UPPER/case", "a b", "repo:", "repo@sha256:xyz", "-x"])
def test_invalid_references(bad: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_reference(bad)


def test_loopback_and_insecure_registries(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "s", insecure_registries=["registry.lan:5000"])
    assert store.is_insecure(parse_reference("127.0.0.1:5000/a"))
    assert store.is_insecure(parse_reference("localhost:5000/a"))
    assert store.is_insecure(parse_reference("registry.lan:5000/a"))
    assert not store.is_insecure(parse_reference("ghcr.io/a"))


def make_rootfs(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    apply_layer(io.BytesIO(TarBuilder().file("hello", name.encode()).bytes()), root)
    return root


def test_tags_names_removal_and_sharing(tmp_path: Path) -> None:
    a = ImageStore(tmp_path / "s")
    b = ImageStore(tmp_path / "s")  # e.g. the CLI next to the server
    img = a.commit(
        make_rootfs(tmp_path, "one"),
        "sha256:" + "1" * 64,
        ["python:3.12"],
        config=ImageConfig(cmd=["python3"]),
        created=None,
        source="test",
    )
    for name in ("python:3.12", "docker.io/library/python:3.12", "sha256:" + "1" * 64):
        found = b.get(name)
        assert found is not None and found.id == img.id, name
    assert b.get("python:3.11") is None and b.get("Not A Name") is None
    b.tag("python:3.12", "127.0.0.1:5000/python:3.12")
    assert a.get("127.0.0.1:5000/python:3.12") is not None
    rootfs = img.lower_dirs[0]
    a.remove("python:3.12")
    assert rootfs.is_dir()  # still tagged as the registry name
    assert [i.name for i in b.list()] == ["127.0.0.1:5000/python:3.12"]
    b.remove("127.0.0.1:5000/python:3.12")
    assert not rootfs.exists()
    assert a.list() == [] and os.listdir(tmp_path / "s" / "rootfs") == []
    with pytest.raises(NotFound):
        a.remove("python:3.12")
    with pytest.raises(NotFound):
        a.tag("nothing", "other")


def test_remove_refuses_mounted_image(tmp_path: Path) -> None:
    import subprocess

    store = ImageStore(tmp_path / "s")
    img = store.commit(
        make_rootfs(tmp_path, "two"),
        "sha256:" + "2" * 64,
        ["inuse"],
        config=ImageConfig(),
        created=None,
        source="test",
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "--bind", str(img.lower_dirs[0]), str(mnt)], check=True)
    try:
        with pytest.raises(Conflict, match="in use"):
            store.remove("inuse")
        assert store.get("inuse") is not None
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    store.remove("inuse")
    assert not img.lower_dirs[0].exists()


def test_stale_work_of_dead_processes_is_reaped(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "s")
    dead = store.root / "tmp" / "pull-999999999-abc"
    dead.mkdir()
    (dead / "half-a-layer").write_bytes(b"x")
    mine = store.root / "tmp" / f"pull-{os.getpid()}-def"
    mine.mkdir()
    ImageStore(tmp_path / "s")
    assert not dead.exists() and mine.exists()
