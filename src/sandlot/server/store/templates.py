"""TemplateStore: template records (table ``templates``), so builds and logs survive restarts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sandlot.server.store import tables


class TemplateStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def load_all(self) -> list[dict[str, Any]]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.templates))).all()
        return [dict(r.record) for r in rows]

    async def save(self, template_id: str, record: dict[str, Any]) -> None:
        t = tables.templates
        async with self._engine.begin() as conn:
            updated = await conn.execute(t.update().where(t.c.id == template_id)
                                         .values(record=record))
            if updated.rowcount == 0:
                await conn.execute(t.insert().values(id=template_id, record=record))

    async def delete(self, template_id: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(tables.templates).where(tables.templates.c.id == template_id))
