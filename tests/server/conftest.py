"""A real uvicorn serving the real app, over the fake runtime or a real one.

``harness`` runs each test twice: over ``FakeRuntime`` (in-process, with hooks to inject
failures) and over the real ``OciRuntime`` (root and runc needed), the same test through the
same runtime boundary. Tests that need the fake's hooks are marked ``fake_only``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sandlot import datadir
from sandlot.config import Config
from sandlot.errors import ImageNotFound
from sandlot.images.model import Image
from sandlot.runtime.oci import OciRuntime
from sandlot.server.app import create_app
from tests.conftest import BUNDLE_CACHE, free_port
from tests.server.fakes import FakeImages, FakeRuntime

API_KEY = "test-key-123"


class _LocalImages:
    """A real runtime's image source here: the names the tests use, all the ``base`` image."""

    def __init__(self, image: Image) -> None:
        self.image = image

    def get(self, name: str) -> Image | None:
        return self.image if name in ("python:3.12", "base") else None

    async def pull(self, name: str, auth: object = None, progress: object = None) -> Image:
        raise ImageNotFound(f"image {name} is not in the test images")


class Harness:
    """Starts/stops the server in this event loop; the runtime survives a restart."""

    def __init__(self, tmp: Path, kind: str = "fake", image: Image | None = None):
        self.cfg = Config.model_validate(
            {
                "data_dir": str(tmp / "data"),
                "server": {
                    "host": "127.0.0.1",
                    "port": free_port(),
                    "api_key": API_KEY,
                    "max_sandbox_timeout_seconds": 3600,
                },
            }
        )
        # Short root: unix socket paths must fit in 108 bytes; pytest's tmp_path may not.
        self.short_root = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
        self.kind = kind
        self.images = FakeImages({"python:3.12", "base"}, pullable={"registry.test/app:1"})
        self.runtime: Any = FakeRuntime(self.short_root, self.images)
        self._real_image = image
        if kind == "oci":
            self.cfg.runtime.warm_pool_size = 0  # cold creates: no warm containers per test
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self.app = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.cfg.server.port}"

    def client(self, key: str | None = API_KEY) -> httpx.AsyncClient:
        headers = {"OPEN-SANDBOX-API-KEY": key} if key else {}
        return httpx.AsyncClient(base_url=self.base, headers=headers, timeout=10)

    async def start(self) -> None:
        datadir.prepare(self.cfg.data_dir)
        bundle = self.cfg.data_dir / "execd-bundle"
        if self.kind == "oci" and not bundle.exists():
            # The machine-wide cache (keyed by code hash): a bundle built per test took ~7 s.
            BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
            bundle.symlink_to(BUNDLE_CACHE)
        if self.kind == "oci" and not isinstance(self.runtime, OciRuntime):
            assert self._real_image is not None
            self.runtime = await OciRuntime.open(self.cfg, images=_LocalImages(self._real_image))
        self.app = create_app(self.cfg, self.runtime)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.cfg.server.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("server exited during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await asyncio.wait_for(self.task, 10)
        self.server = None
        self.task = None

    @property
    def service(self):  # type: ignore[no-untyped-def]
        assert self.app is not None
        return self.app.state.service

    async def wait_state(self, client: httpx.AsyncClient, sid: str, state: str) -> dict:
        for _ in range(500):
            r = await client.get(f"/v1/sandboxes/{sid}")
            if r.status_code == 200 and r.json()["status"]["state"] == state:
                return r.json()  # type: ignore[no-any-return]
            await asyncio.sleep(0.02)
        raise AssertionError(f"{sid} never reached {state}: {r.status_code} {r.text}")


    async def destroy(self) -> None:
        await self.stop()
        if isinstance(self.runtime, FakeRuntime):
            await self.runtime.stop_all()
        else:
            for sid in await self.runtime.list_ids():
                await self.runtime.delete(sid)
            await self.runtime.close()
            assert await self.runtime.list_ids() == set()
        shutil.rmtree(self.short_root, ignore_errors=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_runtime" in metafunc.fixturenames:
        fake_only = metafunc.definition.get_closest_marker("fake_only") is not None
        metafunc.parametrize("harness_runtime", ["fake"] if fake_only else ["fake", "oci"],
                             indirect=True)


@pytest.fixture
def harness_runtime(request: pytest.FixtureRequest) -> tuple[str, Image | None]:
    """Which runtime a ``harness`` runs (and the real one's image): a sync fixture, so that
    building the image (``asyncio.run``) happens outside the test's event loop."""
    kind = request.param
    if kind == "fake":
        return kind, None
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("the real runtime needs root and runc")
    return kind, request.getfixturevalue("base_image")


@pytest.fixture
async def harness(
    harness_runtime: tuple[str, Image | None], tmp_path: Path
) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, *harness_runtime)
    await h.start()
    try:
        yield h
    finally:
        await h.destroy()


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[httpx.AsyncClient]:
    async with harness.client() as c:
        yield c
