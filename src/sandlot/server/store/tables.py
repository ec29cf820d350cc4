"""Table definitions at the current schema version (see ``migrations.py`` for history)."""

from __future__ import annotations

from sqlalchemy import JSON, Column, Float, Integer, MetaData, String, Table, Text

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
