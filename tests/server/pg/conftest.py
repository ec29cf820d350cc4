"""PostgreSQL fixtures: one real server per test session, a fresh database per test.

``postgres_server`` starts Debian's PostgreSQL (``scripts/install-deps.sh`` installs it)
from a temp dir; ``postgres_url`` is the session's database; ``pg_url`` is an empty database
of the test's own, dropped afterwards; ``pg_harness`` is the server harness of
``tests/server/conftest.py`` with its store on ``pg_url``.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.server.conftest import Harness
from tests.server.postgres import PostgresServer, find_pg_bin, running_postgres

_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/install-deps.sh")
    with running_postgres(bin_dir) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database("sandlot")


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"sandlot_t{next(_db_numbers)}"
    url = postgres_server.create_database(name)
    try:
        yield url
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
async def pg_harness(tmp_path: Path, pg_url: str) -> AsyncIterator[Harness]:
    """The real app (fake runtime and images) with its store on PostgreSQL."""
    h = Harness(tmp_path)
    h.cfg.store.url = pg_url
    await h.start()
    try:
        yield h
    finally:
        await h.stop()
        await h.runtime.stop_all()
        shutil.rmtree(h.short_root, ignore_errors=True)
