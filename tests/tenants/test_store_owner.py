"""Migration 5 on a database made by an older sandlot (no owner columns), SQLite and
PostgreSQL: the columns are added, existing sandboxes belong to the default tenant (owner
NULL: the admin's, see test_tenant_api), and owners round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.snapshot_models import SnapshotRecord, SnapshotState
from sandlot.server.store import SandboxStore
from sandlot.server.store.migrations import LATEST
from sandlot.server.store.snapshots import SnapshotStore


def record(sid: str, owner: str | None) -> SandboxRecord:
    now = utcnow()
    return SandboxRecord(id=sid, state=SandboxState.RUNNING, image_uri="base",
                         entrypoint=["sh"], execd_token=None, created_at=now,
                         last_transition_at=now, updated_at=now, owner=owner)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"


async def test_v5_adds_owners_to_an_older_database(store_url: str) -> None:
    assert LATEST >= 5
    store = await SandboxStore.open(store_url)
    await store.save(record("old", None))
    # Turn it into what sandlot before tenants left behind: schema 4, no owner columns.
    async with store.engine.begin() as conn:
        for table in ("sandboxes", "snapshots"):
            await conn.execute(text(f"ALTER TABLE {table} DROP COLUMN owner"))
        await conn.execute(text("DELETE FROM sandlot_schema_version WHERE version >= 5"))
    await store.close()

    store = await SandboxStore.open(store_url)
    try:
        loaded = {r.id: r for r in await store.load_all()}
        assert loaded["old"].owner is None  # the default tenant's
        await store.save(record("new", "team-a"))
        snapshots = SnapshotStore(store.engine)
        now = utcnow()
        await snapshots.save(SnapshotRecord(
            id="snap", sandbox_id="new", name=None, state=SnapshotState.READY,
            image_uri="base", entrypoint=[], created_at=now, last_transition_at=now,
            owner="team-a"))
        async with store.engine.connect() as conn:
            versions = [r[0] for r in await conn.execute(
                text("SELECT version FROM sandlot_schema_version ORDER BY 1"))]
        assert versions[-1] == LATEST
    finally:
        await store.close()
    store = await SandboxStore.open(store_url)  # a fresh process reads the owners back
    try:
        assert {r.id: r.owner for r in await store.load_all()} == {"old": None,
                                                                   "new": "team-a"}
        assert [s.owner for s in await SnapshotStore(store.engine).load_all()] == ["team-a"]
    finally:
        await store.close()
