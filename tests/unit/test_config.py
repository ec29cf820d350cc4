"""Config loading: OpenSandbox server keys are accepted, the env API key applies."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandlot import datadir
from sandlot.cli.main import main
from sandlot.config import API_KEY_ENV, STORE_URL_ENV, Config
from sandlot.runtime.registry import UnknownRuntime, known_runtimes, runtime_class
from sandlot.server.main import StartupRefused, check_config


def test_opensandbox_server_keys_are_read(tmp_path: Path) -> None:
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        '[server]\nhost = "127.0.0.2"\nport = 9000\napi_key = "k"\n'
        "max_sandbox_timeout_seconds = 60\n"
        '[runtime]\ntype = "oci"\n'
    )
    cfg = Config.load(cfg_file)
    assert (cfg.server.host, cfg.server.port, cfg.server.api_key) == ("127.0.0.2", 9000, "k")
    assert cfg.server.max_sandbox_timeout_seconds == 60
    assert cfg.runtime.type == "oci"
    assert cfg.warnings() == [] and cfg.refusals() == []


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert Config.load().server.api_key == "from-env"


def test_environment_key_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As OpenSandbox documents: OPENSANDBOX_SERVER_API_KEY overrides [server] api_key."""
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[server]\napi_key = "from-file"\n')
    assert Config.load(cfg_file).server.api_key == "from-env"
    monkeypatch.delenv(API_KEY_ENV)
    assert Config.load(cfg_file).server.api_key == "from-file"


def test_store_url_from_environment_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployment manifest hands the PostgreSQL DSN over from a Secret this way."""
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[store]\nurl = "sqlite"\n')
    monkeypatch.setenv(STORE_URL_ENV, "postgresql+asyncpg://u:p@db:5432/s")
    assert Config.load(cfg_file).store_url == "postgresql+asyncpg://u:p@db:5432/s"
    monkeypatch.setenv(STORE_URL_ENV, "")  # empty: the file's
    assert Config.load(cfg_file).store_url.startswith("sqlite+aiosqlite:///")


def _load(tmp_path: Path, text: str) -> Config:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(text)
    return Config.load(cfg_file)


def test_unknown_keys_and_sections_are_warned_about(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[server]\nhots = "0.0.0.0"\n[unknown_section]\nwhatever = 1\n'
                          "[runtime]\nwarm_pool_sise = 3\n")
    warned = "\n".join(cfg.warnings())
    assert "[server] hots" in warned and "unknown key" in warned
    assert "[unknown_section] whatever" in warned and "unknown section" in warned
    assert "[runtime] warm_pool_sise" in warned
    assert cfg.refusals() == []


@pytest.mark.parametrize(("text", "key"), [
    ('[secure_runtime]\ntype = "kata"\ndocker_runtime = "kata-runtime"\n',
     "[secure_runtime] type"),
    ('[ingress]\nmode = "gateway"\n', "[ingress] mode"),
    ("[egress]\ndisable_ipv6 = false\n", "[egress] disable_ipv6"),  # mode is honoured
    ("[storage]\nquota_enforced = true\n", "[storage] quota_enforced"),
    ("[ingress]\n[ingress.secure_access]\nactive_key = \"k\"\n", "[ingress] secure_access"),
])
def test_unimplemented_security_keys_are_refused(tmp_path: Path, text: str, key: str) -> None:
    cfg = _load(tmp_path, text)
    assert any(r.startswith(key) and "less protection" in r for r in cfg.refusals()), \
        cfg.refusals()


def test_serve_refuses_them_with_the_reason(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[server]\napi_key = "k"\n[secure_runtime]\ntype = "kata"\n'
                          'docker_runtime = "kata-runtime"\n')
    with pytest.raises(StartupRefused, match=r"\[secure_runtime\] type = 'kata'"):
        check_config(cfg)


# The keys and values of the reference server's `init-config --example docker` file.
UPSTREAM_DOCKER_EXAMPLE = """
[server]
host = "127.0.0.1"
port = 8080
max_sandbox_timeout_seconds = 86400
[log]
level = "INFO"
[runtime]
type = "docker"
execd_image = "opensandbox/execd:v1.0.19"
[storage]
allowed_host_paths = []
volume_default_size = "1Gi"
[store]
type = "sqlite"
path = "~/.opensandbox/opensandbox.db"
[docker]
network_mode = "bridge"
drop_capabilities = ["AUDIT_WRITE", "MKNOD", "NET_ADMIN", "NET_RAW", "SYS_ADMIN"]
no_new_privileges = true
apparmor_profile = ""
pids_limit = 4096
seccomp_profile = ""
[ingress]
mode = "direct"
[egress]
image = "opensandbox/egress:v1.1.0"
mode = "dns"
[renew_intent]
enabled = false
min_interval_seconds = 60
[secure_runtime]
type = ""
"""


def test_the_upstream_example_loads_with_warnings_only(tmp_path: Path) -> None:
    cfg = _load(tmp_path, UPSTREAM_DOCKER_EXAMPLE)
    assert cfg.refusals() == []
    warned = "\n".join(cfg.warnings())
    for key in ("[runtime] execd_image", "[store] path", "[egress] image",
                "[storage] volume_default_size", "[renew_intent] min_interval_seconds"):
        assert key in warned
    # inert values ask for nothing sandlot lacks: not even a warning
    for key in ("[ingress] mode", "[egress] mode", "[store] type", "[secure_runtime] type",
                "[renew_intent] enabled", "[log] level"):  # [log] is honoured
        assert key not in warned


def test_unknown_runtime_type_lists_the_known_ones() -> None:
    cfg = Config.model_validate({"server": {"api_key": "k"}, "runtime": {"type": "nope"}})
    with pytest.raises(StartupRefused) as err:
        check_config(cfg)
    assert "unknown runtime type 'nope'" in str(err.value)
    assert "known runtime types: " in str(err.value) and "oci" in str(err.value)
    with pytest.raises(UnknownRuntime, match="oci"):
        runtime_class("agent-sandbox")
    assert runtime_class("oci").name == "oci"
    assert "oci" in known_runtimes()


def test_init_config_writes_a_loadable_private_file(tmp_path: Path) -> None:
    target = tmp_path / "sandlot.toml"
    result = CliRunner().invoke(main, ["init-config", str(target)])
    assert result.exit_code == 0, result.output
    assert target.stat().st_mode & 0o077 == 0
    cfg = Config.load(target)
    assert cfg.server.api_key and len(cfg.server.api_key) >= 32
    assert cfg.warnings() == [] and cfg.refusals() == []  # sandlot's own template: all honoured
    again = CliRunner().invoke(main, ["init-config", str(target)])
    assert again.exit_code != 0 and "exists" in again.output


def test_init_config_makes_a_missing_data_dir_private(tmp_path: Path) -> None:
    """The default config path is in the data dir: a folder init-config makes must pass
    sandlot serve's check (it refuses a data dir other users can reach)."""
    data = tmp_path / "var" / "lib" / "sandlot"
    result = CliRunner().invoke(main, ["init-config", str(data / "config.toml")])
    assert result.exit_code == 0, result.output
    assert data.stat().st_mode & 0o777 == 0o700
    datadir.check(data)


def test_storage_and_disk_keys_are_honoured(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[runtime]\ndefault_ephemeral_storage = "2Gi"\n'
                          '[storage]\nallowed_host_paths = ["/srv/a"]\n'
                          'volume_default_size = "1Gi"\n')
    assert cfg.storage.allowed_host_paths == ["/srv/a"]
    assert cfg.runtime.default_ephemeral_storage == "2Gi"
    warned = "\n".join(cfg.warnings())
    assert "allowed_host_paths" not in warned and "default_ephemeral_storage" not in warned
    assert "[storage] volume_default_size" in warned  # pvc sizes are not enforced
    assert cfg.refusals() == []


@pytest.mark.parametrize(("section", "match"), [
    ({"runtime": {"default_ephemeral_storage": "1Mi"}}, "default_ephemeral_storage"),
    ({"runtime": {"default_ephemeral_storage": "lots"}}, "default_ephemeral_storage"),
    ({"storage": {"allowed_host_paths": ["/"]}}, "allowed_host_paths"),
    ({"storage": {"allowed_host_paths": ["relative/dir"]}}, "allowed_host_paths"),
])
def test_bad_storage_values_refuse_the_start(section: dict[str, object], match: str) -> None:
    cfg = Config.model_validate({"server": {"api_key": "k"}, **section})
    with pytest.raises(StartupRefused, match=match):
        check_config(cfg)
