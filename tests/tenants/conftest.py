"""Fixtures of the tenant tests: a tenants file, and the PostgreSQL server of tests/server/pg
(imported so the in-process API tests run on both stores)."""

from __future__ import annotations

from tests.server.pg.conftest import pg_url, postgres_server  # noqa: F401 - fixtures
