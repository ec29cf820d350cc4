"""``[log]``: JSON lines or text, to rotating files (server and access logs apart)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot import logsetup
from sandlot.config import Config, LogConfig


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access = logging.getLogger("uvicorn.access")
    access_handlers, access_propagate = list(access.handlers), access.propagate
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    for h in list(access.handlers):
        access.removeHandler(h)
        h.close()
    for h in access_handlers:
        access.addHandler(h)
    access.propagate = access_propagate


def test_json_lines_go_to_the_files_of_the_config(tmp_path: Path,
                                                  restore_logging: None) -> None:
    cfg = Config.model_validate({"log": {
        "level": "debug", "format": "json", "file_enabled": True,
        "file_path": str(tmp_path / "server.log"),
        "access_file_path": str(tmp_path / "access.log")}})
    assert not any("[log]" in w for w in cfg.warnings())  # every [log] key is honoured
    logsetup.configure(cfg.log)
    logging.getLogger("sandlot.test").debug("hello %s", "world", extra={"sandbox_id": "abc"})
    logging.getLogger("uvicorn.access").info("GET /health 200")
    for h in logging.getLogger().handlers + logging.getLogger("uvicorn.access").handlers:
        h.flush()
    line = json.loads((tmp_path / "server.log").read_text().splitlines()[-1])
    assert line["level"] == "DEBUG" and line["logger"] == "sandlot.test"
    assert line["message"] == "hello world" and line["sandbox_id"] == "abc"
    assert "GET /health 200" in (tmp_path / "access.log").read_text()
    assert "GET /health" not in (tmp_path / "server.log").read_text()


def test_text_is_the_default_and_a_bad_level_is_refused(restore_logging: None) -> None:
    assert LogConfig().format == "text"
    with pytest.raises(ValueError, match="not a logging level"):
        logsetup.configure(LogConfig(level="LOUD"))
