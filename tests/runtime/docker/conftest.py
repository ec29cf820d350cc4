"""Fixtures: a real DockerRuntime against the session's private dockerd."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandlot.config import Config
from sandlot.runtime.docker import DockerRuntime
from tests.conftest import BUNDLE_CACHE
from tests.docker_engine import PrivateDockerd
from tests.runtime.helpers import short_tmpdir


@pytest.fixture
def docker_host(private_dockerd: PrivateDockerd, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point docker-py (and so the runtime) at the private dockerd, as DOCKER_HOST does."""
    monkeypatch.setenv("DOCKER_HOST", private_dockerd.host)
    return private_dockerd.host


@pytest.fixture
def docker_data_dir() -> Iterator[Path]:
    d = short_tmpdir("sldrt")
    d.chmod(0o700)
    BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
    (d / "execd-bundle").symlink_to(BUNDLE_CACHE)  # built once per machine, not per test
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def open_docker_runtime(data_dir: Path, **docker: Any) -> DockerRuntime:
    return await DockerRuntime.open(Config.model_validate(
        {"data_dir": str(data_dir), "docker": {"network_mode": "bridge", **docker}}))


async def closing(rt: DockerRuntime, engine: PrivateDockerd) -> None:
    """Delete what ``rt`` holds and check the engine has nothing of it left."""
    try:
        for sid in await rt.list_ids():
            await rt.delete(sid)
        assert await rt.list_ids() == set()
        assert engine.client is not None
        left = engine.client.containers.list(
            all=True, filters={"label": f"io.sandlot.owner={rt.plan.owner}"})
        assert left == [], f"containers left behind: {left}"
    finally:
        await rt.close()


@pytest.fixture
async def docker_runtime(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> AsyncIterator[DockerRuntime]:
    """A runtime on the default bridge network of the private dockerd."""
    rt = await open_docker_runtime(docker_data_dir)
    try:
        yield rt
    finally:
        await closing(rt, private_dockerd)
