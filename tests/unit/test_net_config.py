"""``[network]``/``[egress]`` keys: defaults, the environment default, refused values."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.server.main import StartupRefused, check_config


def test_network_defaults_and_file_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOT_NETWORK_MODE", raising=False)
    cfg = Config()
    assert cfg.network.mode == "isolated" and cfg.egress.mode == "dns+nft"
    assert cfg.network.subnet == "100.88.0.0/16"
    monkeypatch.setenv("SANDLOT_NETWORK_MODE", "none")
    assert Config().network.mode == "none"
    assert Config.model_validate({"network": {"mode": "isolated"}}).network.mode == "isolated"
    monkeypatch.setenv("SANDLOT_NETWORK_MODE", "bogus")
    with pytest.raises(ValueError):
        Config()


def test_ipv6_kept_on_and_host_mode_without_opt_in_are_refused_sidecar_image_warned(
        tmp_path: Path) -> None:
    def load(text: str) -> Config:
        path = tmp_path / "sandlot.toml"
        path.write_text('[server]\napi_key = "k"\n' + text)
        return Config.load(path)

    with pytest.raises(StartupRefused, match="disable_ipv6"):
        check_config(load("[egress]\ndisable_ipv6 = false\n"))
    check_config(load('[egress]\ndisable_ipv6 = true\nmode = "dns"\n'))
    cfg = load('[egress]\nimage = "egress:v1"\n')
    check_config(cfg)
    assert any("[egress] image" in w for w in cfg.warnings())
    with pytest.raises(StartupRefused, match="allow_host_mode = true"):
        check_config(load('[network]\nmode = "host"\n'))
    check_config(load('[network]\nmode = "host"\nallow_host_mode = true\n'))
