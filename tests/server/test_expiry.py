"""Expiry never gets lost: an early timer re-arms, a failed delete is retried."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest

from sandlot.server import service as service_module
from sandlot.server.models import utcnow
from tests.server.conftest import Harness
from tests.server.test_lifecycle_api import create


async def wait_gone(client: httpx.AsyncClient, sid: str, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if (await client.get(f"/v1/sandboxes/{sid}")).status_code == 404:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{sid} did not expire")


async def test_a_timer_that_fires_early_is_rearmed(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = (await create(client))["id"]
    await harness.wait_state(client, sid, "Running")
    svc = harness.service
    rec = svc.get(sid)
    rec.expires_at = utcnow() + timedelta(seconds=0.3)
    await svc._expire(sid)  # as if the loop timer ran before the deadline
    assert (await client.get(f"/v1/sandboxes/{sid}")).status_code == 200
    assert sid in svc.expiry.pending()
    await wait_gone(client, sid)


@pytest.mark.fake_only
async def test_a_failed_expiry_delete_is_retried(
    harness: Harness, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "EXPIRY_RETRY", 0.2)
    sid = (await create(client))["id"]
    await harness.wait_state(client, sid, "Running")
    harness.runtime.fail_deletes = 1
    svc = harness.service
    svc.get(sid).expires_at = utcnow()
    svc.expiry.schedule(sid, utcnow())
    await wait_gone(client, sid)
    assert harness.runtime.fail_deletes == 0
