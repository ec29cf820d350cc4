"""Recipe builds: the shipped base image, derived recipes, failures that leave nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from sandlot.errors import InvalidRequest, NotFound
from sandlot.images.build import ImageBuildError
from sandlot.images.model import Image
from sandlot.images.recipe import load_recipe, parse_recipe, shipped_recipes
from sandlot.images.store import ImageStore


def run_in(root: Path, *cmd: str) -> str:
    out = subprocess.run(["chroot", str(root), *cmd], capture_output=True, text=True, check=True)
    return out.stdout


def test_base_image_has_the_promised_tools(base_image: Image) -> None:
    root = base_image.lower_dirs[0]
    for tool in ("python3", "python", "bash", "curl", "git", "ps"):
        assert (root / "usr/bin" / tool).exists(), tool
    assert run_in(root, "/usr/bin/python3", "-c", "print(6 * 7)").strip() == "42"
    assert "GNU bash" in run_in(root, "/bin/bash", "--version")
    assert (root / "etc/ssl/certs/ca-certificates.crt").stat().st_size > 0
    assert base_image.config.working_dir == "/workspace"
    assert (root / "workspace").is_dir()
    assert not (root / "usr/sbin/policy-rc.d").exists()
    assert not (root / "etc/dpkg/dpkg.cfg.d/sandlot-build-unsafe-io").exists()  # build-only
    assert (root / "etc/dpkg/dpkg.cfg.d").is_dir()
    devices = [p.name for p in (root / "dev").iterdir() if stat.S_ISCHR(p.lstat().st_mode)]
    assert devices == []
    assert (root / "usr/bin/su").stat().st_mode & 0o4000


def test_base_image_is_reused_when_present(image_store: ImageStore, base_image: Image) -> None:
    import asyncio

    again = asyncio.run(image_store.build("base", if_missing=True))
    assert again.id == base_image.id


def _no_mounts_below(path: Path) -> bool:
    with open("/proc/self/mountinfo") as fh:
        return str(path) not in fh.read()


async def test_derived_recipe_builds_from_base(
    image_store: ImageStore, base_image: Image, tmp_path: Path
) -> None:
    """``from = "base"`` copies the cached base image; run, env, cmd and smoke tests apply."""
    store = ImageStore(tmp_path / "images")
    store.commit(
        _copy_rootfs(base_image, tmp_path),
        base_image.id,
        ["base"],
        config=base_image.config,
        created=base_image.created,
        source="test",
        extra=image_store.metadata(base_image.id),
    )
    recipe = tmp_path / "derived.toml"
    recipe.write_text(
        'name = "derived"\ntags = ["derived:1", "derived:latest"]\nfrom = "base"\n'
        'run = ["echo built > /etc/derived", "test -r /proc/self/status", "test -c /dev/null"]\n'
        'env = { COLOR = "blue" }\ncmd = ["python3", "-V"]\nworking_dir = "/srv"\n'
        'smoke_test = ["grep -q built /etc/derived", "test \\"$COLOR\\" = blue"]\n'
    )
    img = await store.build(recipe)
    root = img.lower_dirs[0]
    assert (root / "etc/derived").read_text() == "built\n"
    assert "COLOR=blue" in img.config.env and "LANG=C.UTF-8" in img.config.env
    assert img.config.cmd == ["python3", "-V"] and img.config.working_dir == "/srv"
    latest = store.get("derived:latest")
    assert latest is not None and latest.id == img.id
    assert os.listdir(store.root / "tmp") == []
    assert _no_mounts_below(store.root)


async def test_failed_smoke_test_leaves_nothing(base_image: Image, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    store.commit(
        _copy_rootfs(base_image, tmp_path),
        base_image.id,
        ["base"],
        config=base_image.config,
        created=None,
        source="test",
    )
    marker = f"orphan-{uuid.uuid4().hex}"  # unique, so no other process on the host matches
    recipe = tmp_path / "broken.toml"
    recipe.write_text(
        f'name = "broken"\nfrom = "base"\nrun = ["sh -c \'sleep 300; : {marker}\' &"]\n'
        'smoke_test = ["echo checking; exit 3"]\n'
    )
    with pytest.raises(ImageBuildError, match="exit 3"):
        await store.build(recipe, if_missing=True)
    assert store.get("broken") is None
    assert os.listdir(store.root / "tmp") == []
    assert _no_mounts_below(store.root)
    # The background `sleep 300` died with the build's PID namespace.
    ps = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def _copy_rootfs(img: Image, tmp_path: Path) -> Path:
    dest = tmp_path / "copied-rootfs"
    subprocess.run(["cp", "-a", str(img.lower_dirs[0]), str(dest)], check=True)
    return dest


def test_recipe_parsing_errors_name_the_problem(tmp_path: Path) -> None:
    assert "base" in shipped_recipes()
    assert load_recipe("base").all_tags[0] == "base"
    with pytest.raises(InvalidRequest, match="packages"):
        parse_recipe('name = "x"\npackages = ["ok", "--evil"]\n')
    with pytest.raises(InvalidRequest, match="unknown_key"):
        parse_recipe('name = "x"\nunknown_key = 1\n')
    with pytest.raises(InvalidRequest, match="TOML"):
        parse_recipe("name = ")
    with pytest.raises(NotFound, match="shipped recipes"):
        load_recipe("no-such-recipe")
