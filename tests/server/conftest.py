"""A real uvicorn serving the real app, over a fake runtime and image store."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from sandlot import datadir
from sandlot.config import Config
from sandlot.server.app import create_app
from tests.conftest import free_port
from tests.server.fakes import FakeImages, FakeRuntime

API_KEY = "test-key-123"


class Harness:
    """Starts/stops the server in this event loop; the fakes survive a restart."""

    def __init__(self, tmp: Path):
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
        self.images = FakeImages({"python:3.12", "base"}, pullable={"registry.test/app:1"})
        self.runtime = FakeRuntime(self.short_root, self.images)
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


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path)
    await h.start()
    try:
        yield h
    finally:
        await h.stop()
        await h.runtime.stop_all()
        shutil.rmtree(h.short_root, ignore_errors=True)


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[httpx.AsyncClient]:
    async with harness.client() as c:
        yield c
