"""SandboxStore: sandbox records and endpoint ports over a SQLAlchemy async engine.

Portable across SQLite and PostgreSQL: times are stored as UTC epoch seconds, writes are
single-statement upserts (``INSERT ... ON CONFLICT DO UPDATE``, so concurrent writers of one
row cannot collide), and NUL characters, which PostgreSQL refuses in text columns, are
replaced before they reach the database.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Table, delete, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sandlot.datadir import private_file
from sandlot.server.models import SandboxRecord, SandboxState
from sandlot.server.store import tables
from sandlot.server.store.group_commit import GroupCommit, Rows, Write
from sandlot.server.store.migrations import migrate


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _dt(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL (SQLite can): keep the rest of e.g. runtime stderr.
    return value.replace("\x00", "\ufffd")


def _opt_text(value: str | None) -> str | None:
    return _text(value) if value is not None else None


def _row_values(rec: SandboxRecord) -> dict[str, Any]:
    # JSON columns need no cleaning: json.dumps escapes NUL as \u0000, which PostgreSQL's
    # json type accepts and returns unchanged.
    return {
        "id": rec.id,
        "state": rec.state.value,
        "reason": _opt_text(rec.reason),
        "message": _opt_text(rec.message),
        "image_uri": _text(rec.image_uri),
        "entrypoint": rec.entrypoint,
        "execd_token": rec.execd_token or "",  # "": derived from the server secret
        "metadata": rec.metadata,
        "resource_limits": rec.resource_limits,
        "extensions": rec.extensions,
        "platform": rec.platform,
        "network_policy": rec.network_policy,
        "created_at": _ts(rec.created_at),
        "updated_at": _ts(rec.updated_at),
        "last_transition_at": _ts(rec.last_transition_at),
        "expires_at": _ts(rec.expires_at),
        "owner": rec.owner,
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
        execd_token=m["execd_token"] or None,
        metadata=dict(m["metadata"] or {}),
        resource_limits=dict(m["resource_limits"] or {}),
        extensions=dict(m["extensions"] or {}),
        platform=m["platform"],
        network_policy=m["network_policy"],
        created_at=_dt(m["created_at"]),  # type: ignore[arg-type]
        updated_at=_dt(m["updated_at"]),  # type: ignore[arg-type]
        last_transition_at=_dt(m["last_transition_at"]),  # type: ignore[arg-type]
        expires_at=_dt(m["expires_at"]),
        owner=m["owner"],
    )


_UPSERTS: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Any] = {}


def _upsert_statement(dialect: str, table: Table, keys: tuple[str, ...],
                      columns: tuple[str, ...]) -> Any:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE``, built once per table and column set.

    Values are bound at execution, so the statement (and SQLAlchemy's compiled form of it)
    is reused instead of being rebuilt and re-keyed on every write.
    """
    cache_key = (dialect, table.name, keys, columns)
    stmt = _UPSERTS.get(cache_key)
    if stmt is None:
        insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        stmt = insert.on_conflict_do_update(
            index_elements=list(keys), set_={c: insert.excluded[c] for c in columns}
        )
        _UPSERTS[cache_key] = stmt
    return stmt


async def _update_or_insert(
    conn: AsyncConnection, table: Table, keys: dict[str, Any], values: dict[str, Any]
) -> None:
    """Databases without an upsert: not atomic against a concurrent insert of the row."""
    where = [table.c[k] == v for k, v in keys.items()]
    result = await conn.execute(table.update().where(*where).values(**values))
    if result.rowcount == 0:
        await conn.execute(table.insert().values(**keys, **values))


class SandboxStore:
    """Write-through persistence; the service keeps the live copy in memory.

    Writes go through one ordered queue (group-committed): SQLite allows a single writer,
    and ordering writes per process keeps the last state written equal to the last state
    decided.
    """

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        self._writes = GroupCommit(engine)

    @classmethod
    async def open(cls, url: str) -> SandboxStore:
        parsed = make_url(url)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Root's alone before SQLite first opens it (its -wal/-shm files copy the mode).
            private_file(Path(parsed.database))
        # Pre-ping: a server database may restart or drop idle connections under a
        # long-running sandlot; a dead pooled connection is then replaced, not reported.
        engine = create_async_engine(url, pool_pre_ping=not is_sqlite)
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

    @property
    def engine(self) -> AsyncEngine:
        """The database engine, shared with the other record stores (snapshots)."""
        return self._engine

    async def close(self) -> None:
        await self._writes.flush()
        await self._engine.dispose()

    async def load_all(self) -> list[SandboxRecord]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.sandboxes))).all()
        return [_record(r) for r in rows]

    def _upsert_write(self, table: Table, keys: dict[str, Any], values: dict[str, Any]) -> Write:
        """The write of row ``keys`` + ``values`` (inserted, or ``values`` updated): as rows
        where the database has an upsert (batched with others, see ``group_commit``)."""
        dialect = self._engine.dialect.name
        if dialect in ("postgresql", "sqlite"):
            statement = _upsert_statement(dialect, table, tuple(keys), tuple(values))
            return Rows(table.name, statement, {**keys, **values}, tuple(keys.values()))

        async def write(conn: AsyncConnection) -> None:
            await _update_or_insert(conn, table, keys, values)

        return write

    async def save(self, rec: SandboxRecord) -> None:
        values = _row_values(rec)  # taken now: the record may change before the commit
        key = {"id": values.pop("id")}
        await self._writes.run(self._upsert_write(tables.sandboxes, key, values))

    async def delete(self, sandbox_id: str) -> None:
        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(tables.sandboxes).where(tables.sandboxes.c.id == sandbox_id))
            await conn.execute(
                delete(tables.endpoints).where(tables.endpoints.c.sandbox_id == sandbox_id)
            )

        await self._writes.run(write)

    async def write(self, write: Write) -> None:
        """Run ``write`` in the ordered, group-committed queue (for the other record stores
        whose writes ride along with the sandboxes', e.g. diagnostic events)."""
        await self._writes.run(write)

    async def flush(self) -> None:
        """Wait until every write queued so far is committed."""
        await self._writes.flush()

    async def endpoint_ports(self) -> dict[tuple[str, int], int]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(tables.endpoints))).all()
        return {(r.sandbox_id, r.port): r.host_port for r in rows}

    async def save_endpoint(self, sandbox_id: str, port: int, host_port: int) -> None:
        key = {"sandbox_id": sandbox_id, "port": port}
        await self._writes.run(self._upsert_write(tables.endpoints, key, {"host_port": host_port}))
