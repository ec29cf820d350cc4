"""EventStore: diagnostic events and the last logs of sandboxes (tables ``sandbox_events``,
``sandbox_final_logs``), kept past a sandbox's end until the retention time passes."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from sandlot.server.store import tables
from sandlot.server.store.group_commit import Rows
from sandlot.server.store.sandboxes import SandboxStore

# One statement object for every event: a group commit sends an executemany per statement.
_INSERT_EVENT = tables.sandbox_events.insert()


@dataclass(frozen=True)
class Event:
    sandbox_id: str
    at: float  # UTC epoch seconds
    level: str  # "Normal" | "Warning"
    kind: str
    message: str
    owner: str | None = None  # the sandbox's tenant, kept for after its end


@dataclass(frozen=True)
class FinalLogs:
    captured_at: float
    content: str
    truncated: bool


def _text(value: str) -> str:
    return value.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL


class EventStore:
    """Writes ride in the sandbox store's group-committed queue (same order, same commits)."""

    def __init__(self, store: SandboxStore) -> None:
        self._store = store

    async def add(self, event: Event) -> None:
        values = {"sandbox_id": event.sandbox_id, "at": event.at, "level": event.level,
                  "kind": event.kind, "message": _text(event.message), "owner": event.owner}
        await self._store.write(Rows(tables.sandbox_events.name, _INSERT_EVENT, values))

    async def list(self, sandbox_id: str, limit: int) -> list[Event]:
        """The newest ``limit`` events of the sandbox, oldest first."""
        t = tables.sandbox_events
        query = (select(t).where(t.c.sandbox_id == sandbox_id)
                 .order_by(t.c.seq.desc()).limit(limit))
        async with self._store.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [Event(r.sandbox_id, r.at, r.level, r.kind, r.message, r.owner)
                for r in reversed(rows)]

    async def owner(self, sandbox_id: str) -> tuple[bool, str | None]:
        """(whether any event of the sandbox is kept, the tenant that owned it)."""
        t = tables.sandbox_events
        query = select(t.c.owner).where(t.c.sandbox_id == sandbox_id).order_by(t.c.seq).limit(1)
        async with self._store.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return (row is not None, row[0] if row is not None else None)

    async def count(self, sandbox_id: str) -> int:
        t = tables.sandbox_events
        query = select(func.count()).select_from(t).where(t.c.sandbox_id == sandbox_id)
        async with self._store.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def save_final_logs(self, sandbox_id: str, logs: FinalLogs) -> None:
        t = tables.sandbox_final_logs
        values = {"captured_at": logs.captured_at, "content": _text(logs.content),
                  "truncated": logs.truncated}

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(t).where(t.c.sandbox_id == sandbox_id))
            await conn.execute(t.insert().values(sandbox_id=sandbox_id, **values))

        await self._store.write(write)

    async def final_logs(self, sandbox_id: str) -> FinalLogs | None:
        t = tables.sandbox_final_logs
        async with self._store.engine.connect() as conn:
            row = (await conn.execute(select(t).where(t.c.sandbox_id == sandbox_id))).first()
        return FinalLogs(row.captured_at, row.content, bool(row.truncated)) if row else None

    async def purge(self, cutoff: float, keep: set[str]) -> int:
        """Forget sandboxes whose newest event is older than ``cutoff``, except ``keep``."""
        t = tables.sandbox_events
        query = (select(t.c.sandbox_id).group_by(t.c.sandbox_id)
                 .having(func.max(t.c.at) < cutoff))
        async with self._store.engine.connect() as conn:
            old = [r[0] for r in (await conn.execute(query)).all() if r[0] not in keep]
        if not old:
            return 0
        logs = tables.sandbox_final_logs

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(t).where(t.c.sandbox_id.in_(old)))
            await conn.execute(delete(logs).where(logs.c.sandbox_id.in_(old)))

        await self._store.write(write)
        return len(old)

    async def flush(self) -> None:
        """Wait for queued writes (a read right after a record sees it)."""
        await self._store.flush()
