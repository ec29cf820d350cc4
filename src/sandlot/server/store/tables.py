"""Table definitions at the current schema version (see ``migrations.py`` for history)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

schema_version = Table(
    "sandlot_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", Float, nullable=False),
)

sandboxes = Table(
    "sandboxes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("state", String(32), nullable=False),
    Column("reason", String(128)),
    Column("message", Text),
    Column("image_uri", Text, nullable=False),
    Column("entrypoint", JSON, nullable=False),
    Column("execd_token", String(128), nullable=False),
    Column("metadata", JSON, nullable=False),
    Column("resource_limits", JSON, nullable=False),
    Column("extensions", JSON, nullable=False),
    Column("platform", JSON),
    Column("network_policy", JSON),
    # Times are UTC epoch seconds: portable across SQLite and PostgreSQL without tz pitfalls.
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("last_transition_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("owner", String(128)),  # the tenant; NULL: the default tenant (v5)
)

endpoints = Table(
    "sandbox_endpoints",
    metadata,
    Column("sandbox_id", String(64), primary_key=True),
    Column("port", Integer, primary_key=True),
    Column("host_port", Integer, nullable=False),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("sandbox_id", String(64), nullable=False),
    Column("name", Text),
    Column("state", String(32), nullable=False),
    Column("reason", String(128)),
    Column("message", Text),
    Column("image_uri", Text, nullable=False),  # the source sandbox's image
    Column("entrypoint", JSON, nullable=False),  # the source sandbox's entrypoint
    Column("created_at", Float, nullable=False),
    Column("last_transition_at", Float, nullable=False),
    Column("owner", String(128)),  # the tenant; NULL: the default tenant (v5)
)

pools = Table(
    "pools",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("template", JSON, nullable=False),  # as given (a PodTemplateSpec subset)
    Column("capacity", JSON, nullable=False),  # capacitySpec
    Column("revision", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

templates = Table(
    "templates",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("record", JSON, nullable=False),  # the whole TemplateRecord (small, read at start)
)

# Diagnostic events of sandboxes, kept past their end for [diagnostics] retention_seconds.
sandbox_events = Table(
    "sandbox_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("sandbox_id", String(64), nullable=False),
    Column("at", Float, nullable=False),
    Column("level", String(16), nullable=False),  # Normal | Warning
    Column("kind", String(64), nullable=False),  # StateChanged, Pulled, OOMKilled, ...
    Column("message", Text, nullable=False),
    Column("owner", String(128)),  # the sandbox's tenant (None: the default tenant's)
    Index("ix_sandbox_events_sandbox", "sandbox_id", "seq"),
)

# The last container and entrypoint output of an ended sandbox (its files are gone with it).
sandbox_final_logs = Table(
    "sandbox_final_logs",
    metadata,
    Column("sandbox_id", String(64), primary_key=True),
    Column("captured_at", Float, nullable=False),
    Column("content", Text, nullable=False),
    Column("truncated", Boolean, nullable=False),
)

# Web console sign-ins (console/sessions.py): only digests, of the session id (the cookie) and
# of the API key signed in with, so a copy of the database signs nobody in.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id_digest", String(64), primary_key=True),
    Column("key_digest", String(64), nullable=False),
    Column("created_at", Float, nullable=False),  # UTC epoch seconds
    Column("last_used_at", Float, nullable=False),
)
