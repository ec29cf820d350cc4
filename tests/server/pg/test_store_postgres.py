"""The store, the service and the app on a real PostgreSQL (see ``conftest.py``).

The same operations the SQLite tests exercise, plus what only a server database brings:
concurrent start-ups and writers, and connections cut by a database restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.store import SandboxStore
from sandlot.server.store.events import Event, EventStore
from sandlot.server.store.migrations import LATEST
from tests.server.conftest import Harness
from tests.server.postgres import PostgresServer
from tests.server.test_lifecycle_api import create


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def record(sid: str, **overrides: object) -> SandboxRecord:
    now = utcnow()
    rec = SandboxRecord(
        id=sid,
        state=SandboxState.RUNNING,
        image_uri="registry.test/app:1",
        entrypoint=["python", "-c", "print('héllo')"],
        execd_token="t" * 43,
        created_at=now,
        last_transition_at=now,
        updated_at=now,
        expires_at=now + timedelta(minutes=5),
        reason="Ready",
        message="sandbox is running",
        metadata={"team": "ml", "note": "ünïcode ✓", "quote": 'it\'s "x"'},
        resource_limits={"cpu": "500m", "memory": "512Mi"},
        extensions={"x": "y"},
        platform={"os": "linux", "arch": "amd64"},
        network_policy={"defaultAction": "deny", "egress": [{"action": "allow", "target": "*"}]},
    )
    for key, value in overrides.items():
        setattr(rec, key, value)
    return rec


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[SandboxStore]:
    store = await SandboxStore.open(url)
    try:
        yield store
    finally:
        await store.close()


async def stored(url: str) -> dict[str, SandboxRecord]:
    """What a fresh process would load from the database."""
    async with opened(url) as store:
        return {r.id: r for r in await store.load_all()}


async def schema_versions(store: SandboxStore) -> list[int]:
    async with store._engine.connect() as conn:
        rows = await conn.execute(text("SELECT version FROM sandlot_schema_version ORDER BY 1"))
        return [int(r[0]) for r in rows]


# ----- the store on its own ----------------------------------------------------------------


async def test_migrations_create_the_schema_once(pg_url: str) -> None:
    store = await SandboxStore.open(pg_url)
    assert await schema_versions(store) == list(range(1, LATEST + 1))
    async with store._engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = 'public'"
            )
        )
        types = {(r[0], r[1]): r[2] for r in rows}
    assert types[("sandboxes", "created_at")] == "double precision"
    assert types[("sandboxes", "metadata")] in ("json", "jsonb")
    assert ("sandbox_endpoints", "host_port") in types
    await store.save(record("a"))
    await store.close()

    # A second start finds the schema current: no migration re-runs, the data is intact.
    store = await SandboxStore.open(pg_url)
    assert await schema_versions(store) == list(range(1, LATEST + 1))
    assert [r.id for r in await store.load_all()] == ["a"]
    async with store._engine.begin() as conn:
        await conn.execute(text("INSERT INTO sandlot_schema_version VALUES (99, 0)"))
    await store.close()
    with pytest.raises(RuntimeError, match="newer"):
        await SandboxStore.open(pg_url)


async def test_concurrent_first_starts_migrate_once(pg_url: str) -> None:
    # Several servers starting at once against an empty database (e.g. a rolling deploy).
    stores = await asyncio.gather(*(SandboxStore.open(pg_url) for _ in range(4)))
    try:
        assert await schema_versions(stores[0]) == list(range(1, LATEST + 1))
    finally:
        for store in stores:
            await store.close()


async def test_roundtrip_update_and_delete(pg_url: str) -> None:
    store = await SandboxStore.open(pg_url)
    try:
        a = record("a")
        b = record(
            "b",
            state=SandboxState.PENDING,
            expires_at=None,
            reason=None,
            message=None,
            platform=None,
            network_policy=None,
            metadata={},
        )
        await store.save(a)
        await store.save(b)
        assert await stored(pg_url) == {"a": a, "b": b}
        loaded = (await stored(pg_url))["a"]
        assert loaded.created_at.tzinfo is not None
        assert loaded.created_at == a.created_at  # microseconds survive, in UTC

        # Update state, renew, patch metadata: each save overwrites the row.
        a.transition(SandboxState.PAUSED, "Paused", "paused by user")
        a.expires_at = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        a.metadata = {"team": "infra", "env": "prod"}
        await store.save(a)
        assert (await stored(pg_url))["a"] == a

        await store.save_endpoint("a", 44772, 40001)
        await store.save_endpoint("a", 8080, 40002)
        await store.save_endpoint("a", 44772, 40003)  # re-published on another host port
        await store.save_endpoint("b", 44772, 40004)
        assert await store.endpoint_ports() == {
            ("a", 44772): 40003,
            ("a", 8080): 40002,
            ("b", 44772): 40004,
        }

        await store.delete("a")
        assert set(await stored(pg_url)) == {"b"}
        assert await store.endpoint_ports() == {("b", 44772): 40004}
        await store.delete("a")  # deleting twice is harmless
    finally:
        await store.close()


async def test_text_survives_whatever_clients_send(pg_url: str) -> None:
    # PostgreSQL rejects NUL in text (SQLite does not); messages carry runtime stderr and
    # metadata is client data, so a NUL must not fail the write.
    store = await SandboxStore.open(pg_url)
    try:
        rec = record(
            "nul",
            message="runc: \x00garbage",
            metadata={"k\x00": "v\x00w"},
            entrypoint=["sh", "-c", "printf '\x00'"],
        )
        await store.save(rec)
        loaded = (await stored(pg_url))["nul"]
        assert loaded.message is not None and loaded.message.startswith("runc: ")
        assert "garbage" in loaded.message
        assert len(loaded.metadata) == 1 and len(loaded.entrypoint) == 3
    finally:
        await store.close()


async def test_concurrent_writers_of_the_same_records(pg_url: str) -> None:
    # Two stores (two processes' worth of connections) creating the same rows at once:
    # the write must be an upsert, not "update, then insert if nothing was updated".
    one, two = await SandboxStore.open(pg_url), await SandboxStore.open(pg_url)
    try:
        for round_ in range(5):
            recs = [record(f"r{round_}-{i}") for i in range(4)]
            await asyncio.gather(
                *(store.save(rec) for rec in recs for store in (one, two)),
                *(
                    store.save_endpoint(rec.id, 44772, 41000 + i)
                    for i, rec in enumerate(recs)
                    for store in (one, two)
                ),
            )
        assert len(await stored(pg_url)) == 20
        assert len(await one.endpoint_ports()) == 20
    finally:
        await one.close()
        await two.close()


async def test_a_batch_with_repeated_rows_sends_each_row_once(pg_url: str) -> None:
    # One group commit holding several upserts of one row (and events between them), sent
    # as one executemany per statement through asyncpg: the row's last write wins, the
    # events keep their order.
    async with opened(pg_url) as store:
        events = EventStore(store)
        rec = record("twice")
        writes = []
        for n, state in enumerate((SandboxState.PENDING, SandboxState.RUNNING,
                                   SandboxState.PAUSED)):
            rec.state = state
            writes += [store.save(rec), store.save_endpoint(rec.id, 44772, 41000 + n),
                       events.add(Event(rec.id, float(n), "Normal", state.value, f"e{n}"))]
        await asyncio.gather(*writes)
        assert [e.message for e in await events.list("twice", 10)] == ["e0", "e1", "e2"]
        assert await store.endpoint_ports() == {("twice", 44772): 41002}
    assert (await stored(pg_url))["twice"].state == SandboxState.PAUSED


async def test_store_reconnects_after_database_restart(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    store = await SandboxStore.open(pg_url)
    try:
        rec = record("a")
        await store.save(rec)
        assert [r.id for r in await store.load_all()] == ["a"]  # the pool holds a connection
        await asyncio.to_thread(postgres_server.restart)
        rec.transition(SandboxState.PAUSED, "Paused", None)
        await store.save(rec)
        assert (await store.load_all())[0].state == SandboxState.PAUSED
    finally:
        await store.close()


# ----- the real app over HTTP ------------------------------------------------------------------


async def test_app_create_running_delete_cycle(pg_harness: Harness, pg_url: str) -> None:
    async with pg_harness.client() as c:
        body = await create(c)
        sid = body["id"]
        got = await pg_harness.wait_state(c, sid, "Running")
        assert got["metadata"] == {"team": "ml", "name": "first"}
        row = (await stored(pg_url))[sid]
        assert row.state == SandboxState.RUNNING
        assert row.metadata == {"team": "ml", "name": "first"}
        assert row.resource_limits == {"cpu": "500m", "memory": "512Mi"}
        assert row.expires_at is not None
        assert row.expires_at == datetime.fromisoformat(body["expiresAt"])

        ports = {}
        for port in (44772, 18080):  # opened and stored by the create (the SDKs ask for both)
            ep = (await c.get(f"/v1/sandboxes/{sid}/endpoints/{port}")).json()
            ports[(sid, port)] = int(ep["endpoint"].rsplit(":", 1)[1])
        async with opened(pg_url) as store:
            assert await store.endpoint_ports() == ports

        assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        assert (await c.get(f"/v1/sandboxes/{sid}")).status_code == 404
        assert await stored(pg_url) == {}
        assert sid not in pg_harness.runtime.containers


async def test_app_accepts_nul_in_client_strings(pg_harness: Harness, pg_url: str) -> None:
    # JSON lets a client send U+0000; PostgreSQL text would refuse it and fail the request.
    pg_harness.cfg.server.create_wait_seconds = 0  # answered Pending, then Failed
    async with pg_harness.client() as c:
        # (Metadata follows label rules, which refuse NUL; extensions take any string.)
        body = await create(c, image={"uri": "nope/\u0000x:1"}, extensions={"k": "a\u0000b"})
        got = await pg_harness.wait_state(c, body["id"], "Failed")
        assert got["status"]["reason"] == "PROVISIONING_ERROR"
        assert got["extensions"] == {"k": "a\u0000b"}
    row = (await stored(pg_url))[body["id"]]
    assert row.image_uri == "nope/\ufffdx:1" and row.extensions == {"k": "a\u0000b"}


async def test_app_list_filters_and_pagination_from_the_database(
    pg_harness: Harness,
) -> None:
    async with pg_harness.client() as c:
        ids = [(await create(c, metadata={"n": str(i), "grp": "a.b-c"}))["id"] for i in range(5)]
        other = (await create(c, metadata={"grp": "other", "note": "x_y"}))["id"]
        for sid in [*ids, other]:
            await pg_harness.wait_state(c, sid, "Running")
        assert (await c.post(f"/v1/sandboxes/{ids[0]}/pause")).status_code == 202

    # Restart: the listing now comes from what PostgreSQL returned.
    await pg_harness.stop()
    await pg_harness.start()

    async with pg_harness.client() as c:
        page = (await c.get("/v1/sandboxes", params={"pageSize": 2, "page": 2})).json()
        assert page["pagination"] == {
            "page": 2,
            "pageSize": 2,
            "totalItems": 6,
            "totalPages": 3,
            "hasNextPage": True,
        }
        # newest first: creation order survived
        assert [s["id"] for s in page["items"]] == [ids[3], ids[2]]
        page = (await c.get("/v1/sandboxes", params={"pageSize": 4, "page": 2})).json()
        assert [s["id"] for s in page["items"]] == [ids[1], ids[0]]
        assert page["pagination"]["hasNextPage"] is False

        r = await c.get("/v1/sandboxes", params=[("state", "Paused")])
        assert [s["id"] for s in r.json()["items"]] == [ids[0]]
        r = await c.get("/v1/sandboxes", params=[("state", "Paused"), ("state", "Running")])
        assert r.json()["pagination"]["totalItems"] == 6

        r = await c.get("/v1/sandboxes", params={"metadata": "grp=a.b-c&n=3"})
        assert [s["id"] for s in r.json()["items"]] == [ids[3]]
        r = await c.get("/v1/sandboxes", params={"metadata": "note=x_y"})
        assert [s["id"] for s in r.json()["items"]] == [other]


async def test_app_state_renew_and_metadata_are_persisted(pg_harness: Harness, pg_url: str) -> None:
    async with pg_harness.client() as c:
        sid = (await create(c))["id"]
        await pg_harness.wait_state(c, sid, "Running")

        assert (await c.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
        assert (await stored(pg_url))[sid].state == SandboxState.PAUSED
        assert (await c.post(f"/v1/sandboxes/{sid}/resume")).status_code == 202
        assert (await stored(pg_url))[sid].state == SandboxState.RUNNING

        new = (datetime.now(UTC) + timedelta(hours=5)).replace(microsecond=123456)
        r = await c.post(f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": iso(new)})
        assert r.status_code == 200, r.text
        assert (await stored(pg_url))[sid].expires_at == new

        r = await c.patch(f"/v1/sandboxes/{sid}/metadata", json={"team": None, "env": "prod"})
        assert r.status_code == 200
        assert (await stored(pg_url))[sid].metadata == {"name": "first", "env": "prod"}

    await pg_harness.stop()
    await pg_harness.start()
    async with pg_harness.client() as c:
        got = (await c.get(f"/v1/sandboxes/{sid}")).json()
        assert got["status"]["state"] == "Running"
        assert got["metadata"] == {"name": "first", "env": "prod"}
        assert datetime.fromisoformat(got["expiresAt"]) == new
        assert pg_harness.service.expiry.pending()[sid] == new
        assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    assert await stored(pg_url) == {}


async def test_app_restart_reconciles_from_the_database(pg_harness: Harness) -> None:
    async with pg_harness.client() as c:
        keep = (await create(c))["id"]
        vanish = (await create(c))["id"]
        for sid in (keep, vanish):
            await pg_harness.wait_state(c, sid, "Running")
    await pg_harness.stop()
    await pg_harness.runtime.delete(vanish)
    await pg_harness.start()
    async with pg_harness.client() as c:
        assert (await c.get(f"/v1/sandboxes/{keep}")).json()["status"]["state"] == "Running"
        failed = (await c.get(f"/v1/sandboxes/{vanish}")).json()
        assert failed["status"]["state"] == "Failed"
        assert failed["status"]["reason"] == "CONTAINER_EXITED_ERROR"
