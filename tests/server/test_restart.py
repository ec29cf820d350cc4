"""Restart reconciliation and the store's migrations (fake runtime; real SQLite)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from sandlot.errors import RuntimeFailure
from sandlot.runtime.base import ContainerState
from sandlot.server import reconcile
from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.store import SandboxStore
from sandlot.server.store.migrations import LATEST
from tests.server.conftest import Harness
from tests.server.fakes import FakeContainer
from tests.server.test_lifecycle_api import create


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


@pytest.mark.fake_only
async def test_restart_reconciles_runtime_and_store(harness: Harness) -> None:
    async with harness.client() as c:
        keep = (await create(c))["id"]
        vanish = (await create(c))["id"]
        paused = (await create(c))["id"]
        expire = (await create(c))["id"]
        for sid in (keep, vanish, paused, expire):
            await harness.wait_state(c, sid, "Running")
        await c.post(f"/v1/sandboxes/{paused}/pause")
        ep = (await c.get(f"/v1/sandboxes/{keep}/endpoints/44772")).json()
        soon = datetime.now(UTC) + timedelta(seconds=1)
        await c.post(f"/v1/sandboxes/{expire}/renew-expiration", json={"expiresAt": iso(soon)})
        later = datetime.now(UTC) + timedelta(hours=1)
        await c.post(f"/v1/sandboxes/{keep}/renew-expiration", json={"expiresAt": iso(later)})

    await harness.stop()
    # While the server is down: one container vanishes, an orphan appears, one expires.
    await harness.runtime.delete(vanish)
    orphan_spec = harness.runtime.created[0].__class__(
        sandbox_id="orphan-1", image=harness.runtime.created[0].image, entrypoint=["true"]
    )
    orphan = FakeContainer(orphan_spec)
    await orphan.start()
    harness.runtime.containers["orphan-1"] = orphan
    await asyncio.sleep(1.2)
    await harness.start()

    async with harness.client() as c:
        got = (await c.get(f"/v1/sandboxes/{keep}")).json()
        assert got["status"]["state"] == "Running"
        assert (await c.get(f"/v1/sandboxes/{paused}")).json()["status"]["state"] == "Paused"
        failed = (await c.get(f"/v1/sandboxes/{vanish}")).json()
        assert failed["status"]["state"] == "Failed"
        assert failed["status"]["reason"] == "CONTAINER_EXITED_ERROR"
        assert (await c.get(f"/v1/sandboxes/{expire}")).status_code == 404
        assert expire not in harness.runtime.containers
        assert "orphan-1" not in harness.runtime.containers
        # The direct endpoint is served again on the same port, and still works.
        again = (await c.get(f"/v1/sandboxes/{keep}/endpoints/44772")).json()
        assert again["endpoint"] == ep["endpoint"]
        async with httpx.AsyncClient(base_url=f"http://{ep['endpoint']}") as direct:
            assert (await direct.get("/ping", headers=ep["headers"])).text == "pong"
        items = (await c.get("/v1/sandboxes")).json()["items"]
        assert sorted(s["id"] for s in items) == sorted([keep, vanish, paused])
        # Expiry timers were rebuilt from the store (that a timer fires is pinned by
        # test_expiry_deletes_sandbox; no wall-clock race with a loaded machine here).
        rearmed = harness.service.expiry.pending()[keep]
        assert abs((rearmed - later).total_seconds()) < 0.001


@pytest.mark.fake_only
async def test_pending_at_shutdown_becomes_failed(harness: Harness) -> None:
    harness.images.pull_gate = asyncio.Event()
    async with harness.client() as c:
        sid = (await create(c, image={"uri": "registry.test/app:1"}))["id"]
    await harness.stop()
    await harness.start()
    async with harness.client() as c:
        got = (await c.get(f"/v1/sandboxes/{sid}")).json()
    assert got["status"]["state"] == "Failed"
    assert got["status"]["reason"] == "PROVISIONING_ERROR"


@pytest.mark.fake_only
async def test_a_stopped_answer_is_confirmed_before_a_sandbox_is_failed(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """runsc once reported a live sandbox stopped right after a restart (its signal-0 probe
    into the sandbox failed on a loaded host); reconciliation asks again before failing it,
    and a container that stays stopped is still failed."""
    monkeypatch.setattr(reconcile, "STOPPED_CONFIRM_PAUSE", 0.0)
    async with harness.client() as c:
        flaky, dead = (await create(c))["id"], (await create(c))["id"]
        for sid in (flaky, dead):
            await harness.wait_state(c, sid, "Running")
    await harness.stop()
    harness.runtime.inspect_script[flaky] = [ContainerState.STOPPED]
    harness.runtime.containers[dead].state = ContainerState.STOPPED
    await harness.start()
    async with harness.client() as c:
        assert (await c.get(f"/v1/sandboxes/{flaky}")).json()["status"]["state"] == "Running"
        gone = (await c.get(f"/v1/sandboxes/{dead}")).json()["status"]
        assert gone["state"] == "Failed" and gone["reason"] == "CONTAINER_EXITED_ERROR"
    assert flaky in harness.runtime.containers and dead not in harness.runtime.containers


@pytest.mark.fake_only
async def test_a_failed_inspect_at_start_up_keeps_the_sandbox(harness: Harness) -> None:
    """An unknown state is not a vanished container: the server starts, the record stays."""
    async with harness.client() as c:
        sid = (await create(c))["id"]
        await harness.wait_state(c, sid, "Running")
    await harness.stop()
    harness.runtime.inspect_script[sid] = [RuntimeFailure("runsc state failed (injected)")]
    await harness.start()
    async with harness.client() as c:
        assert (await c.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Running"
        run = await c.get(f"/v1/sandboxes/{sid}/endpoints/44772")
        assert run.status_code == 200
    assert harness.service.expiry.pending().get(sid) is not None


def _record(sid: str) -> SandboxRecord:
    now = utcnow()
    return SandboxRecord(
        id=sid,
        state=SandboxState.RUNNING,
        image_uri="base",
        entrypoint=["sh"],
        execd_token="t",
        created_at=now,
        last_transition_at=now,
        updated_at=now,
        expires_at=now + timedelta(minutes=5),
        metadata={"k": "v"},
    )


async def test_store_roundtrip_and_migrations(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'db' / 's.db'}"
    store = await SandboxStore.open(url)
    rec = _record("a")
    await store.save(rec)
    rec.metadata["k2"] = "v2"
    await store.save(rec)
    await store.save_endpoint("a", 44772, 40001)
    await store.close()

    store = await SandboxStore.open(url)  # re-open: no re-migration, data intact
    [loaded] = await store.load_all()
    assert loaded == rec
    assert await store.endpoint_ports() == {("a", 44772): 40001}
    async with store._engine.connect() as conn:
        versions = (await conn.execute(text("SELECT version FROM sandlot_schema_version"))).all()
        assert [v[0] for v in versions] == list(range(1, LATEST + 1))
        await conn.execute(text("INSERT INTO sandlot_schema_version VALUES (99, 0)"))
        await conn.commit()
    await store.delete("a")
    assert await store.load_all() == [] and await store.endpoint_ports() == {}
    await store.close()
    with pytest.raises(RuntimeError, match="newer"):
        await SandboxStore.open(url)


@pytest.mark.fake_only
async def test_tokens_are_derived_and_old_stored_tokens_still_work(harness: Harness) -> None:
    """New sandboxes store no token (derived from the server secret, the same after a
    restart); a row written by an older sandlot keeps its random token, the one its execd
    was started with."""
    async with harness.client() as c:
        sid = (await create(c))["id"]
        await harness.wait_state(c, sid, "Running")
        token = (await c.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()["headers"][
            "X-EXECD-ACCESS-TOKEN"]
    assert token == harness.runtime.created[-1].execd_token
    await harness.stop()
    store = await SandboxStore.open(harness.cfg.store_url)
    try:
        async with store._engine.connect() as conn:
            rows = (await conn.execute(text("SELECT id, execd_token FROM sandboxes"))).all()
        assert [tuple(r) for r in rows] == [(sid, "")]
        legacy = _record("legacy-1")
        legacy.execd_token = "an-old-random-token"
        await store.save(legacy)
    finally:
        await store.close()
    await harness.start()
    svc = harness.service
    assert svc.execd_token(svc.record(sid)) == token  # same secret, same token
    assert svc.execd_token(svc.record("legacy-1")) == "an-old-random-token"
