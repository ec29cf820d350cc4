"""``[network]``/``[egress]`` keys: defaults, the environment default, refused values."""

from __future__ import annotations

import logging

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


def test_ipv6_kept_on_is_refused_and_sidecar_image_warned(
        caplog: pytest.LogCaptureFixture) -> None:
    base = {"server": {"api_key": "k"}}
    with pytest.raises(StartupRefused, match="disable_ipv6"):
        check_config(Config.model_validate({**base, "egress": {"disable_ipv6": False}}))
    with caplog.at_level(logging.WARNING):
        check_config(Config.model_validate({**base, "egress": {"image": "egress:v1"}}))
    assert "[egress] image is ignored" in caplog.text
