"""Start-up refusals of ``sandlot serve`` and resource quantity parsing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sandlot.config import Config
from sandlot.errors import InvalidRequest
from sandlot.server.main import StartupRefused, check_config
from sandlot.server.quantity import parse_cpu, parse_memory


def cfg(**server: object) -> Config:
    return Config.model_validate({"server": server})


def test_refuses_without_api_key() -> None:
    with pytest.raises(StartupRefused, match="API key"):
        check_config(cfg())


def test_insecure_no_auth_is_loopback_only() -> None:
    check_config(cfg(insecure_no_auth=True, host="127.0.0.1"))
    check_config(cfg(insecure_no_auth=True, host="::1"))
    with pytest.raises(StartupRefused, match="loopback"):
        check_config(cfg(insecure_no_auth=True, host="0.0.0.0"))


def test_key_allows_any_host() -> None:
    check_config(cfg(api_key="k", host="0.0.0.0"))


@pytest.mark.parametrize("kind", ["agent-sandbox", "firecracker"])
def test_unavailable_runtime_types(kind: str) -> None:
    c = Config.model_validate({"server": {"api_key": "k"}, "runtime": {"type": kind}})
    with pytest.raises(StartupRefused, match=f"unknown runtime type '{kind}'.*oci"):
        check_config(c)


def test_serve_cli_exits_with_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "sandlot", "serve", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "API key" in proc.stderr


@pytest.mark.parametrize(
    ("raw", "cores"), [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("250m", 0.25)]
)
def test_cpu(raw: str, cores: float) -> None:
    assert parse_cpu(raw) == cores


@pytest.mark.parametrize(
    ("raw", "size"),
    [("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 10**9), ("128974848", 128974848)],
)
def test_memory(raw: str, size: int) -> None:
    assert parse_memory(raw) == size


@pytest.mark.parametrize("raw", ["lots", "1Xi", "-1", "", "1 Gi Gi"])
def test_bad_quantities(raw: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_memory(raw)
    with pytest.raises(InvalidRequest):
        parse_cpu(raw)


def test_store_url_defaults_to_sqlite_in_data_dir() -> None:
    default = "sqlite+aiosqlite:////srv/sl/sandlot.db"
    for url in (None, "", "sqlite", "SQLite "):
        c = Config.model_validate({"data_dir": "/srv/sl", "store": {"url": url}})
        assert c.store_url == default
    pg = "postgresql+asyncpg://sandlot:pw@127.0.0.1:5432/sandlot"
    assert Config.model_validate({"store": {"url": pg}}).store_url == pg
