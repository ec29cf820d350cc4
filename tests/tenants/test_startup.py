"""Start-up with a tenants file: where it is found, and what ``sandlot serve`` refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.server.main import StartupRefused, check_config
from sandlot.server.tenancy.directory import PATH_ENV, tenants_path
from tests.tenants.tenants_setup import tenants_toml


def cfg(tmp_path: Path, text: str | None, **server: object) -> Config:
    data: dict = {"server": server}
    if text is not None:
        path = tmp_path / "tenants.toml"
        path.write_text(text)
        data["tenants"] = {"file": str(path)}
    return Config.model_validate(data)


def test_tenants_alone_are_enough_authentication(tmp_path: Path) -> None:
    check_config(cfg(tmp_path, tenants_toml(), host="0.0.0.0"))


def test_tenants_with_insecure_no_auth_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StartupRefused, match="insecure-no-auth"):
        check_config(cfg(tmp_path, tenants_toml(), insecure_no_auth=True))


def test_a_broken_or_missing_tenants_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StartupRefused, match="defined twice"):
        check_config(cfg(tmp_path, tenants_toml() + tenants_toml(), api_key="k"))
    missing = Config.model_validate({"server": {"api_key": "k"},
                                     "tenants": {"file": str(tmp_path / "nope.toml")}})
    with pytest.raises(StartupRefused, match="does not exist"):
        check_config(missing)


def test_the_file_is_found_as_on_the_reference(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(PATH_ENV, raising=False)
    assert tenants_path(None) is None  # no file: single-tenant
    default = tmp_path / ".opensandbox" / "tenants.toml"
    default.parent.mkdir()
    default.write_text(tenants_toml())
    assert tenants_path(None) == default
    monkeypatch.setenv(PATH_ENV, str(tmp_path / "env.toml"))
    assert tenants_path(None) == tmp_path / "env.toml"
    assert tenants_path("/etc/t.toml") == Path("/etc/t.toml")  # [tenants] file wins


def test_tenant_entries_in_the_server_config_are_pointed_to_the_tenants_file() -> None:
    with pytest.raises(ValueError, match="go in the tenants file"):
        Config.model_validate({"tenants": [{"name": "a", "api_keys": ["k"]}]})
