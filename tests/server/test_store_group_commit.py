"""Store writes on SQLite: concurrent writes share commits, keep their order and outcomes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from sandlot.server.models import SandboxState
from sandlot.server.store import SandboxStore
from sandlot.server.store.events import Event, EventStore
from sandlot.server.store.group_commit import Rows, Write, plan
from tests.server.pg.test_store_postgres import record


def test_concurrent_writes_share_commits_and_all_land(tmp_path: Path) -> None:
    async def go() -> tuple[int, list[str]]:
        store = await SandboxStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        commits = 0

        def count(_conn: object) -> None:
            nonlocal commits
            commits += 1

        event.listen(store._engine.sync_engine, "commit", count)
        try:
            recs = [record(f"sb-{i:02d}") for i in range(30)]
            await asyncio.gather(*(store.save(r) for r in recs),
                                 *(store.save_endpoint(r.id, 44772, 40000 + i)
                                   for i, r in enumerate(recs)))
            loaded = sorted(r.id for r in await store.load_all())
            ports = await store.endpoint_ports()
            assert ports[("sb-07", 44772)] == 40007
            return commits, loaded
        finally:
            await store.close()

    commits, loaded = asyncio.run(go())
    assert loaded == [f"sb-{i:02d}" for i in range(30)]
    assert commits < 60  # 60 writes; queued ones went into shared transactions


def test_last_write_wins_in_submission_order(tmp_path: Path) -> None:
    async def go() -> SandboxState:
        store = await SandboxStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        try:
            rec = record("sb-order")
            writes = []
            for state in (SandboxState.PENDING, SandboxState.RUNNING, SandboxState.PAUSED):
                rec.state = state
                writes.append(store.save(rec))  # values are taken when save() is called
            await asyncio.gather(*writes)
            (loaded,) = await store.load_all()
            return loaded.state
        finally:
            await store.close()

    assert asyncio.run(go()) == SandboxState.PAUSED


def test_a_failing_write_does_not_fail_the_others(tmp_path: Path) -> None:
    async def go() -> tuple[list[object], list[str]]:
        store = await SandboxStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        try:
            good = [record(f"sb-ok-{i}") for i in range(5)]
            results = await asyncio.gather(
                store.save(good[0]), store.save(good[1]), _failing_write(store),
                store.save(good[2]), store.save(good[3]), store.save(good[4]),
                return_exceptions=True,
            )
            return results, sorted(r.id for r in await store.load_all())
        finally:
            await store.close()

    results, loaded = asyncio.run(go())
    assert [r is None for r in results] == [True, True, False, True, True, True]
    assert isinstance(results[2], OperationalError)
    assert loaded == [f"sb-ok-{i}" for i in range(5)]


async def _failing_write(store: SandboxStore) -> None:
    """A write the database refuses, queued among good ones (through the store's queue)."""

    async def write(conn: AsyncConnection) -> None:
        await conn.execute(text("INSERT INTO no_such_table VALUES (1)"))

    await store._writes.run(write)


def test_a_burst_of_creates_writes_with_one_executemany_per_statement(tmp_path: Path) -> None:
    """Ten creates' rows (sandbox, event, two endpoints each) in one transaction reach the
    driver as one call per statement, not one per row; every row lands, events in order."""

    async def go() -> tuple[list[tuple[int, bool]], list[str], list[Event], dict[str, str]]:
        store = await SandboxStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        events = EventStore(store)
        calls: list[tuple[int, bool]] = []

        def seen(_c: object, _cur: object, _stmt: str, params: object, _ctx: object,
                 executemany: bool) -> None:
            calls.append((len(params) if executemany else 1, executemany))  # type: ignore[arg-type]

        try:
            await store.save(record("warm-up"))  # the queue's drainer is now idle
            event.listen(store._engine.sync_engine, "before_cursor_execute", seen)
            recs = [record(f"sb-{i}") for i in range(10)]

            async def create(i: int) -> None:
                rec = recs[i]
                await asyncio.gather(
                    store.save(rec),
                    events.add(Event(rec.id, float(i), "Normal", "Started", f"started {i}")),
                    store.save_endpoint(rec.id, 44772, 41000 + i),
                    store.save_endpoint(rec.id, 8080, 42000 + i))

            await asyncio.gather(*(create(i) for i in range(10)))
            event.remove(store._engine.sync_engine, "before_cursor_execute", seen)
            loaded = sorted(r.id for r in await store.load_all())
            ports = await store.endpoint_ports()
            kept = [e for i in range(10) for e in await events.list(f"sb-{i}", 5)]
            states = {r.id: r.state.value for r in await store.load_all()}
            assert ports[("sb-3", 8080)] == 42003 and len(ports) == 20
            return calls, loaded, kept, states
        finally:
            await store.close()

    calls, loaded, kept, _ = asyncio.run(go())
    assert loaded == sorted(["warm-up", *(f"sb-{i}" for i in range(10))])
    assert [e.message for e in kept] == [f"started {i}" for i in range(10)]
    writes = [c for c in calls if c[1]]
    # The first create's writes may commit alone (the queue was idle); the rest are batched.
    assert sum(n for n, _ in writes) >= 30, calls
    assert len(calls) <= 6, calls


def test_a_delete_between_saves_of_one_sandbox_keeps_its_place(tmp_path: Path) -> None:
    """Rows are regrouped per statement, but never across a write given as code (a delete):
    save, delete, save of one id in one batch leaves the row; save, save, delete removes it."""

    async def go() -> tuple[list[str], dict[tuple[str, int], int]]:
        store = await SandboxStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
        try:
            a, b = record("sb-a"), record("sb-b")
            await asyncio.gather(
                store.save(a), store.save_endpoint("sb-a", 1, 1001), store.delete("sb-a"),
                store.save(a),
                store.save(b), store.save_endpoint("sb-b", 1, 1002), store.save(b),
                store.delete("sb-b"))
            return [r.id for r in await store.load_all()], await store.endpoint_ports()
        finally:
            await store.close()

    ids, ports = asyncio.run(go())
    assert ids == ["sb-a"]
    assert ports == {}  # sb-a's endpoint row went with its delete, sb-b's with its own


def test_repeated_upserts_of_a_row_in_one_batch_send_the_last() -> None:
    statement, other = object(), object()
    writes: list[Write] = [
        Rows("sandboxes", statement, {"id": "x", "state": "Pending"}, ("x",)),
        Rows("sandbox_events", other, {"sandbox_id": "x", "kind": "a"}),
        Rows("sandboxes", statement, {"id": "y", "state": "Pending"}, ("y",)),
        Rows("sandboxes", statement, {"id": "x", "state": "Running"}, ("x",)),
        Rows("sandbox_events", other, {"sandbox_id": "x", "kind": "b"}),
    ]
    assert list(plan(writes)) == [
        (statement, [{"id": "x", "state": "Running"}, {"id": "y", "state": "Pending"}]),
        (other, [{"sandbox_id": "x", "kind": "a"}, {"sandbox_id": "x", "kind": "b"}]),
    ]


def test_a_second_statement_for_one_table_closes_the_group() -> None:
    """Two column sets for one table must not pass each other (they may touch one row)."""
    full, partial = object(), object()
    first = Rows("sandboxes", full, {"id": "x", "state": "Pending"}, ("x",))
    second = Rows("sandboxes", partial, {"id": "x", "state": "Running"}, ("x",))
    third = Rows("sandboxes", full, {"id": "x", "state": "Paused"}, ("x",))
    assert list(plan([first, second, third])) == [
        (full, [first.params]), (partial, [second.params]), (full, [third.params])]
