"""Config loading: OpenSandbox server keys are accepted, the env API key applies."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandlot.cli.main import main
from sandlot.config import API_KEY_ENV, Config


def test_opensandbox_server_keys_are_read(tmp_path: Path) -> None:
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        '[server]\nhost = "127.0.0.2"\nport = 9000\napi_key = "k"\n'
        "max_sandbox_timeout_seconds = 60\n"
        '[runtime]\ntype = "oci"\n'
        "[unknown_section]\nwhatever = 1\n"
    )
    cfg = Config.load(cfg_file)
    assert (cfg.server.host, cfg.server.port, cfg.server.api_key) == ("127.0.0.2", 9000, "k")
    assert cfg.server.max_sandbox_timeout_seconds == 60
    assert cfg.runtime.type == "oci"


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert Config.load().server.api_key == "from-env"


def test_config_key_wins_over_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[server]\napi_key = "from-file"\n')
    assert Config.load(cfg_file).server.api_key == "from-file"


def test_init_config_writes_a_loadable_private_file(tmp_path: Path) -> None:
    target = tmp_path / "sandlot.toml"
    result = CliRunner().invoke(main, ["init-config", str(target)])
    assert result.exit_code == 0, result.output
    assert target.stat().st_mode & 0o077 == 0
    cfg = Config.load(target)
    assert cfg.server.api_key and len(cfg.server.api_key) >= 32
    again = CliRunner().invoke(main, ["init-config", str(target)])
    assert again.exit_code != 0 and "exists" in again.output
