"""SandboxStore: sandbox records and endpoint ports over a SQLAlchemy async engine."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, event, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sandlot.server.models import SandboxRecord, SandboxState
from sandlot.server.store import tables
from sandlot.server.store.migrations import migrate


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _dt(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _row_values(rec: SandboxRecord) -> dict[str, Any]:
    return {
        "id": rec.id,
        "state": rec.state.value,
        "reason": rec.reason,
        "message": rec.message,
        "image_uri": rec.image_uri,
        "entrypoint": rec.entrypoint,
        "execd_token": rec.execd_token,
        "metadata": rec.metadata,
        "resource_limits": rec.resource_limits,
        "extensions": rec.extensions,
        "platform": rec.platform,
        "network_policy": rec.network_policy,
        "created_at": _ts(rec.created_at),
        "updated_at": _ts(rec.updated_at),
        "last_transition_at": _ts(rec.last_transition_at),
        "expires_at": _ts(rec.expires_at),
    }


def _record(row: Any) -> SandboxRecord:
    m = row._mapping
    return SandboxRecord(
        id=m["id"],
        state=SandboxState(m["state"]),
        reason=m["reason"],
        message=m["message"],
        image_uri=m["image_uri"],
        entrypoint=list(m["entrypoint"]),
        execd_token=m["execd_token"],
        metadata=dict(m["metadata"] or {}),
        resource_limits=dict(m["resource_limits"] or {}),
        extensions=dict(m["extensions"] or {}),
        platform=m["platform"],
        network_policy=m["network_policy"],
        created_at=_dt(m["created_at"]),  # type: ignore[arg-type]
        updated_at=_dt(m["updated_at"]),  # type: ignore[arg-type]
        last_transition_at=_dt(m["last_transition_at"]),  # type: ignore[arg-type]
        expires_at=_dt(m["expires_at"]),
    )


class SandboxStore:
    """Write-through persistence; the service keeps the live copy in memory.

    Writes are serialised by one lock: SQLite allows a single writer, and ordering writes
    per process keeps the last state written equal to the last state decided.
    """

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        self._write = asyncio.Lock()

    @classmethod
    async def open(cls, url: str) -> SandboxStore:
        parsed = make_url(url)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url)
        if is_sqlite:

            @event.listens_for(engine.sync_engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                # WAL + NORMAL: durable across process crashes (kill -9), fast commits.
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA busy_timeout=5000")
                cur.close()

        async with engine.begin() as conn:
            await conn.run_sync(migrate)
        return cls(engine)

    async def close(self) -> None:
        await self._engine.dispose()

    async def load_all(self) -> list[SandboxRecord]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.sandboxes))).all()
        return [_record(r) for r in rows]

    async def save(self, rec: SandboxRecord) -> None:
        values = _row_values(rec)
        t = tables.sandboxes
        async with self._write, self._engine.begin() as conn:
            result = await conn.execute(t.update().where(t.c.id == rec.id).values(**values))
            if result.rowcount == 0:
                await conn.execute(t.insert().values(**values))

    async def delete(self, sandbox_id: str) -> None:
        async with self._write, self._engine.begin() as conn:
            await conn.execute(delete(tables.sandboxes).where(tables.sandboxes.c.id == sandbox_id))
            await conn.execute(
                delete(tables.endpoints).where(tables.endpoints.c.sandbox_id == sandbox_id)
            )

    async def endpoint_ports(self) -> dict[tuple[str, int], int]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.endpoints))).all()
        return {(r.sandbox_id, r.port): r.host_port for r in rows}

    async def save_endpoint(self, sandbox_id: str, port: int, host_port: int) -> None:
        t = tables.endpoints
        async with self._write, self._engine.begin() as conn:
            result = await conn.execute(
                t.update()
                .where((t.c.sandbox_id == sandbox_id) & (t.c.port == port))
                .values(host_port=host_port)
            )
            if result.rowcount == 0:
                await conn.execute(
                    t.insert().values(sandbox_id=sandbox_id, port=port, host_port=host_port)
                )
