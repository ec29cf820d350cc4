"""The released SDK (async and sync) over the app with the fake runtime: failures the real
runtime cannot produce on demand, seen the way the reference server's clients see them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync import SandboxSync

from tests.server.conftest import API_KEY, Harness

# Wire shapes, over the fake runtime (whose hooks inject the failures): the same behaviours
# over the real runtime are pinned through ``sandlot serve`` in
# tests/compat/test_reference_wire_sdk.py, so the suite is not run twice here.
pytestmark = pytest.mark.fake_only


def domain(harness: Harness) -> str:
    return f"127.0.0.1:{harness.cfg.server.port}"


async def test_sdk_create_raises_the_image_pull_failure(harness: Harness) -> None:
    cfg = ConnectionConfig(domain=domain(harness), api_key=API_KEY)
    with pytest.raises(SandboxApiException) as exc:
        await Sandbox.create(
            "nope/missing:1", connection_config=cfg, ready_timeout=timedelta(seconds=30)
        )
    assert exc.value.status_code == 500
    assert exc.value.error.code == "DOCKER::SANDBOX_IMAGE_PULL_FAILED"
    assert exc.value.error.message.startswith("Failed to pull image nope/missing:1: ")
    assert harness.runtime.containers == {}


async def test_sync_sdk_create_raises_the_start_failure(harness: Harness) -> None:
    harness.runtime.fail_create = "no cgroup for you"
    cfg = ConnectionConfigSync(domain=domain(harness), api_key=API_KEY)

    def create() -> None:
        SandboxSync.create("python:3.12", connection_config=cfg)

    with pytest.raises(SandboxApiException) as exc:
        await asyncio.to_thread(create)  # the server runs on this test's loop
    assert exc.value.status_code == 500
    assert exc.value.error.code == "DOCKER::SANDBOX_START_FAILED"
    assert "no cgroup for you" in (exc.value.error.message or "")
