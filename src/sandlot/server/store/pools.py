"""PoolStore: named pool definitions (table ``pools``), so pools come back after a restart."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sandlot.server.pool_models import PoolRecord
from sandlot.server.store import tables


class PoolStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def load_all(self) -> list[PoolRecord]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.pools))).all()
        return [PoolRecord(name=r.name, template=dict(r.template), capacity=dict(r.capacity),
                           revision=int(r.revision),
                           created_at=datetime.fromtimestamp(r.created_at, UTC))
                for r in rows]

    async def save(self, rec: PoolRecord) -> None:
        t = tables.pools
        values = {"template": rec.template, "capacity": rec.capacity,
                  "revision": rec.revision, "created_at": rec.created_at.timestamp()}
        async with self._engine.begin() as conn:
            updated = await conn.execute(t.update().where(t.c.name == rec.name).values(**values))
            if updated.rowcount == 0:
                await conn.execute(t.insert().values(name=rec.name, **values))

    async def delete(self, name: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(tables.pools).where(tables.pools.c.name == name))
