"""ConsoleSessionStore: the console's sign-ins (table ``console_sessions``), so a server restart
signs nobody out. Rows hold digests only; see ``sandlot.console.sessions``."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from sandlot.server.store import tables
from sandlot.server.store.sandboxes import SandboxStore


@dataclass
class SessionRow:
    id_digest: str
    key_digest: str
    created_at: float  # UTC epoch seconds
    last_used_at: float


class ConsoleSessionStore:
    """Writes ride in the sandbox store's group-committed queue (one SQLite writer)."""

    def __init__(self, store: SandboxStore) -> None:
        self._store = store

    async def get(self, id_digest: str) -> SessionRow | None:
        t = tables.console_sessions
        async with self._store.engine.connect() as conn:
            row = (await conn.execute(select(t).where(t.c.id_digest == id_digest))).first()
        if row is None:
            return None
        return SessionRow(row.id_digest, row.key_digest, row.created_at, row.last_used_at)

    async def add(self, row: SessionRow) -> None:
        values = {"id_digest": row.id_digest, "key_digest": row.key_digest,
                  "created_at": row.created_at, "last_used_at": row.last_used_at}

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(tables.console_sessions.insert().values(**values))

        await self._store.write(write)

    async def touch(self, id_digest: str, last_used_at: float) -> None:
        t = tables.console_sessions

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(t.update().where(t.c.id_digest == id_digest)
                               .values(last_used_at=last_used_at))

        await self._store.write(write)

    async def delete(self, id_digest: str) -> None:
        t = tables.console_sessions

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(t).where(t.c.id_digest == id_digest))

        await self._store.write(write)

    async def prune(self, idle_before: float, created_before: float) -> None:
        """Forget sessions idle since ``idle_before`` or made before ``created_before``."""
        t = tables.console_sessions

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(t).where(or_(t.c.last_used_at < idle_before,
                                                   t.c.created_at < created_before)))

        await self._store.write(write)
