"""SnapshotStore: snapshot records in the same database as the sandboxes (table ``snapshots``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sandlot.server.snapshot_models import SnapshotRecord, SnapshotState
from sandlot.server.store import tables


def _ts(value: datetime) -> float:
    return value.timestamp()


def _dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _record(row: Any) -> SnapshotRecord:
    m = row._mapping
    return SnapshotRecord(
        id=m["id"], sandbox_id=m["sandbox_id"], name=m["name"],
        state=SnapshotState(m["state"]), reason=m["reason"], message=m["message"],
        image_uri=m["image_uri"], entrypoint=list(m["entrypoint"]),
        created_at=_dt(m["created_at"]), last_transition_at=_dt(m["last_transition_at"]),
        owner=m["owner"],
    )


class SnapshotStore:
    """Write-through persistence of snapshot records; the service keeps them in memory."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def load_all(self) -> list[SnapshotRecord]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.snapshots))).all()
        return [_record(r) for r in rows]

    async def save(self, rec: SnapshotRecord) -> None:
        values = {
            "sandbox_id": rec.sandbox_id, "name": rec.name, "state": rec.state.value,
            "reason": rec.reason, "message": (rec.message or "").replace("\x00", "\ufffd"),
            "image_uri": rec.image_uri, "entrypoint": rec.entrypoint,
            "created_at": _ts(rec.created_at), "last_transition_at": _ts(rec.last_transition_at),
            "owner": rec.owner,
        }
        t = tables.snapshots
        async with self._engine.begin() as conn:
            updated = await conn.execute(t.update().where(t.c.id == rec.id).values(**values))
            if updated.rowcount == 0:
                await conn.execute(t.insert().values(id=rec.id, **values))

    async def delete(self, snapshot_id: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(tables.snapshots).where(tables.snapshots.c.id == snapshot_id))
