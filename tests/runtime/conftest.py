"""Fixtures: a real OciRuntime in a throw-away data dir, and the images it runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandlot.images.model import Image
from sandlot.runtime.oci import OciRuntime
from tests.conftest import BUNDLE_CACHE
from tests.runtime.helpers import needs_root, runtime_fixture, short_tmpdir


@pytest.fixture(scope="session")
def runtime_data_dir() -> Iterator[Path]:
    """One data dir per session; its execd bundle is the machine-wide cache's (keyed by
    code hash), not built per session: building it here took ~14 s and removing it at the
    session's end ~17 s on a loaded machine (the last test's teardown)."""
    needs_root()
    d = short_tmpdir("slrt")
    BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
    (d / "execd-bundle").symlink_to(BUNDLE_CACHE)
    yield d
    shutil.rmtree(d, ignore_errors=True)
    # test_boundary_contract's runsc data dir beside it (its own state, the same bundle)
    shutil.rmtree(d.with_name(d.name + "-gv"), ignore_errors=True)


@pytest.fixture
async def oci_runtime(runtime_data_dir: Path) -> AsyncIterator[OciRuntime]:
    async for rt in runtime_fixture(runtime_data_dir):
        yield rt


@pytest.fixture
def rt_image(base_image: Image) -> Image:
    """The image store's ``base`` image (Debian with python3, bash, coreutils)."""
    return base_image


@pytest.fixture(scope="session")
def scratch_image() -> Iterator[Image]:
    """An image with no Python, no shell and no libc: only empty top-level directories."""
    d = short_tmpdir("slscratch")
    for sub in ("etc", "tmp", "proc", "sys", "dev", "run", "opt", "root"):
        (d / sub).mkdir()
    os.chmod(d / "tmp", 0o1777)
    yield Image(name="scratch", id="scratch", lower_dirs=[d])
    shutil.rmtree(d, ignore_errors=True)
