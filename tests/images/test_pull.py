"""Pulling from a real registry (Debian's docker-registry on loopback) through skopeo."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandlot.errors import ImageNotFound, ImagePullError
from sandlot.images.model import RegistryAuth
from sandlot.images.progress import Progress
from sandlot.images.store import ImageStore
from tests.conftest import LocalRegistry
from tests.images.oci_util import TarBuilder, write_oci_layout

CONFIG = {
    "Env": ["PATH=/usr/bin:/bin", "GREETING=hi"],
    "Entrypoint": ["/bin/entry"],
    "Cmd": ["serve", "--now"],
    "WorkingDir": "/srv",
    "User": "1000:1000",
}


def two_layer_layout(tmp_path: Path) -> Path:
    lower = (
        TarBuilder()
        .dir("etc")
        .file("etc/os-release", b"ID=test\n")
        .file("etc/obsolete", b"old")
        .dir("srv")
        .file("srv/app.py", b"print(1)\n", mode=0o755)
        .file("srv/su", b"x", mode=0o4755)
    )
    upper = TarBuilder().file("etc/.wh.obsolete").file("srv/new.txt", b"new\n", uid=1000, gid=1000)
    layout = tmp_path / "layout"
    write_oci_layout(layout, [lower.bytes(), upper.bytes()], config=CONFIG)
    return layout


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


async def test_pull_unpacks_layers_and_records_config(
    store: ImageStore, registry: LocalRegistry, tmp_path: Path
) -> None:
    ref = registry.push_layout(two_layer_layout(tmp_path), "tests/app:1.0")
    events: list[Progress] = []
    img = await store.pull(ref, progress=events.append)
    root = img.lower_dirs[0]
    assert (root / "etc/os-release").read_bytes() == b"ID=test\n"
    assert not (root / "etc/obsolete").exists()  # whiteout in the upper layer
    assert (root / "srv/new.txt").stat().st_uid == 1000
    assert (root / "srv/su").stat().st_mode & 0o7777 == 0o4755
    assert img.config.env == CONFIG["Env"]
    assert img.config.entrypoint == ["/bin/entry"]
    assert img.config.cmd == ["serve", "--now"]
    assert img.config.working_dir == "/srv"
    assert img.config.user == "1000:1000"
    assert img.id.startswith("sha256:") and img.name == ref
    assert {e.phase for e in events} >= {"resolve", "download", "unpack", "done"}
    # Found again by the name as given, and nothing left in the scratch area.
    assert store.get(ref) == img
    assert os.listdir(store.root / "tmp") == []


async def test_pull_same_image_again_reuses_rootfs(
    store: ImageStore, registry: LocalRegistry, tmp_path: Path
) -> None:
    ref = registry.push_layout(two_layer_layout(tmp_path), "tests/app:1.0")
    first, second = await asyncio.gather(store.pull(ref), store.pull(ref))
    assert first.id == second.id
    other = registry.push_layout(two_layer_layout(tmp_path), "tests/app-copy:2")
    third = await store.pull(other)
    assert third.id == first.id and third.lower_dirs == first.lower_dirs
    assert len(os.listdir(store.root / "rootfs")) == 1
    assert {i.name for i in store.list()} == {ref, other}


async def test_missing_tag_and_repo_raise_image_not_found(
    store: ImageStore, registry: LocalRegistry, tmp_path: Path
) -> None:
    registry.push_layout(two_layer_layout(tmp_path), "tests/app:1.0")
    with pytest.raises(ImageNotFound):
        await store.pull(registry.ref("tests/app:nope"))
    with pytest.raises(ImageNotFound):
        await store.pull(registry.ref("tests/nothing-here:1"))
    assert store.list() == []
    assert os.listdir(store.root / "tmp") == []


async def test_unreachable_registry_is_a_pull_error(store: ImageStore) -> None:
    from tests.conftest import free_port

    with pytest.raises(ImagePullError):
        await store.pull(f"127.0.0.1:{free_port()}/tests/app:1")


async def test_pull_with_auth(
    store: ImageStore, auth_registry: LocalRegistry, tmp_path: Path
) -> None:
    ref = auth_registry.push_layout(two_layer_layout(tmp_path), "private/app:1")
    with pytest.raises(ImagePullError, match="refused access"):
        await store.pull(ref)
    with pytest.raises(ImagePullError, match="refused access"):
        await store.pull(ref, auth=RegistryAuth("tester", "wrong-password"))
    assert auth_registry.auth is not None
    img = await store.pull(ref, auth=auth_registry.auth)
    assert (img.lower_dirs[0] / "srv/app.py").exists()
    # The credentials file lived only in the (now deleted) scratch dir.
    assert os.listdir(store.root / "tmp") == []


async def test_pulled_image_has_working_setuid_binary(
    store: ImageStore, registry: LocalRegistry, base_image, tmp_path: Path
) -> None:
    """A real Debian rootfs survives push + pull: setuid bits, owners, python runs."""
    import subprocess

    ref = registry.push_rootfs(base_image.lower_dirs[0], "library/python:3.12")
    img = await store.pull(ref)
    root = img.lower_dirs[0]
    su = root / "usr/bin/su"
    assert su.stat().st_mode & 0o4000, "setuid bit of su lost"
    out = subprocess.run(
        ["chroot", str(root), "/usr/bin/python3", "-c", "print(1 + 1)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "2"
