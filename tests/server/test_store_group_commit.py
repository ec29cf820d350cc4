"""Store writes on SQLite: concurrent writes share commits, keep their order and outcomes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from sandlot.server.models import SandboxState
from sandlot.server.store import SandboxStore
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
