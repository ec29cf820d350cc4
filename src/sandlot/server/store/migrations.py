"""Versioned schema migrations, applied in order at start-up inside one transaction each.

A hand-rolled list rather than Alembic: the schema is small, migrations must run unattended
at every start of ``sandlot serve`` (no separate upgrade command), and on both SQLite and
PostgreSQL through the same async engine. Servers starting at once against one PostgreSQL
database take turns (a transaction-scoped advisory lock), so only the first one migrates.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text

from sandlot.server.store import tables


def _v1_initial(conn: Connection) -> None:
    tables.sandboxes.create(conn)
    tables.endpoints.create(conn)


def _v2_snapshots(conn: Connection) -> None:
    tables.snapshots.create(conn)


def _v3_pools(conn: Connection) -> None:
    tables.pools.create(conn)


def _v4_templates(conn: Connection) -> None:
    tables.templates.create(conn)


def _v5_owners(conn: Connection) -> None:
    """Tenants: who owns each sandbox and snapshot (NULL: the default tenant).

    A database made from scratch has the column already (v1 and v2 create the tables as
    ``tables`` defines them now); one made by an older sandlot gets it here."""
    for table in (tables.sandboxes, tables.snapshots):
        columns = {c["name"] for c in inspect(conn).get_columns(table.name)}
        if "owner" not in columns:
            conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN owner VARCHAR(128)"))


def _v6_diagnostics(conn: Connection) -> None:
    """Diagnostic events and the last logs of ended sandboxes (diagnostics.py)."""
    tables.sandbox_events.create(conn, checkfirst=True)
    tables.sandbox_final_logs.create(conn, checkfirst=True)


def _v7_console_sessions(conn: Connection) -> None:
    """Console sessions survive a restart (console/sessions.py)."""
    tables.console_sessions.create(conn, checkfirst=True)


# Key of the PostgreSQL advisory lock held while migrating (any fixed 64-bit number).
_PG_MIGRATION_LOCK = 0x53414E444C4F54  # "SANDLOT"

# Append only. Index + 1 is the version number.
MIGRATIONS: list[Callable[[Connection], None]] = [
    _v1_initial, _v2_snapshots, _v3_pools, _v4_templates, _v5_owners, _v6_diagnostics,
    _v7_console_sessions,
]
LATEST = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table(tables.schema_version.name):
        tables.schema_version.create(conn)
        return 0
    row = conn.execute(
        select(tables.schema_version.c.version).order_by(tables.schema_version.c.version.desc())
    ).first()
    return int(row[0]) if row else 0


def migrate(conn: Connection) -> int:
    """Bring the schema to ``LATEST``; returns the version found before migrating.

    Runs inside the caller's transaction: on PostgreSQL the DDL commits or rolls back as one,
    and the advisory lock is held until then.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
    found = current_version(conn)
    if found > LATEST:
        raise RuntimeError(
            f"database schema version {found} is newer than this sandlot ({LATEST}); "
            "upgrade sandlot"
        )
    for version in range(found + 1, LATEST + 1):
        MIGRATIONS[version - 1](conn)
        conn.execute(tables.schema_version.insert().values(version=version, applied_at=time.time()))
    return found
