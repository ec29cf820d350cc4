"""`sandlot image ...` as users run it: a real subprocess against a temp data dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import LocalRegistry
from tests.images.oci_util import TarBuilder, write_oci_layout


def sandlot(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandlot", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=300,
    )


def test_import_ls_tag_rm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    archive = tmp_path / "rootfs.tar"
    archive.write_bytes(TarBuilder().dir("bin").file("bin/hello", b"hi", mode=0o755).bytes())
    res = sandlot("image", "import", str(archive), "--tag", "hello:1", "--data-dir", str(data))
    assert res.returncode == 0, res.stderr
    res = sandlot("image", "tag", "hello:1", "hello:stable", "--data-dir", str(data))
    assert res.returncode == 0, res.stderr
    res = sandlot("image", "ls", "--data-dir", str(data))
    assert res.returncode == 0, res.stderr
    assert "hello:1" in res.stdout and "hello:stable" in res.stdout
    rootfs_dir = data / "images" / "rootfs"
    assert len(list(rootfs_dir.iterdir())) == 1
    res = sandlot("image", "rm", "hello:1", "hello:stable", "--data-dir", str(data))
    assert res.returncode == 0, res.stderr
    assert sandlot("image", "ls", "-q", "--data-dir", str(data)).stdout.strip() == ""
    assert list(rootfs_dir.iterdir()) == []  # files gone with the last name


def test_errors_are_reported_not_raised(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    res = sandlot("image", "rm", "nothing:here", "--data-dir", data)
    assert res.returncode == 1 and "NOT_FOUND" in res.stderr and "Traceback" not in res.stderr
    res = sandlot("image", "build", "no-such-recipe", "--data-dir", data)
    assert res.returncode == 1 and "shipped recipes" in res.stderr
    res = sandlot("image", "pull", "x", "--username", "u", "--data-dir", data)
    assert res.returncode == 2 and "password" in res.stderr


def test_pull_with_password_stdin(auth_registry: LocalRegistry, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_oci_layout(layout, [TarBuilder().file("marker", b"pulled").bytes()])
    ref = auth_registry.push_layout(layout, "cli/app:1")
    data = tmp_path / "data"
    assert auth_registry.auth is not None
    res = sandlot("image", "pull", ref, "--data-dir", str(data))
    assert res.returncode == 1 and "refused access" in res.stderr
    res = sandlot(
        "image",
        "pull",
        ref,
        "-u",
        auth_registry.auth.username,
        "--password-stdin",
        "--data-dir",
        str(data),
        stdin=auth_registry.auth.password + "\n",
    )
    assert res.returncode == 0, res.stderr
    assert ref in sandlot("image", "ls", "-q", "--data-dir", str(data)).stdout
    res = sandlot(
        "image",
        "pull",
        auth_registry.ref("cli/app:missing"),
        "-u",
        "tester",
        "-p",
        auth_registry.auth.password,
        "--data-dir",
        str(data),
    )
    assert res.returncode == 1 and "IMAGE_NOT_FOUND" in res.stderr


def test_build_if_missing_skips_existing(image_store, base_image) -> None:  # type: ignore[no-untyped-def]
    data_dir = image_store.root.parent  # the cached store lives in <dir>/images
    if image_store.root.name != "images":
        return
    res = sandlot("image", "build", "base", "--if-missing", "--data-dir", str(data_dir))
    assert res.returncode == 0, res.stderr
    assert base_image.id in res.stdout
