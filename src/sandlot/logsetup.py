"""Logging of ``sandlot serve`` from ``[log]`` (the reference server's keys, plus ``format``).

Text lines or one JSON object per line (for log shippers); stderr by default, or rotating
files with ``file_enabled`` (the server log and uvicorn's access log apart, as upstream).
The JSON formatter is a few lines over the standard library's ``json`` rather than one more
dependency.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
from pathlib import Path
from typing import Any

from sandlot.config import LogConfig

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
DEFAULT_DIR = Path.home() / "logs" / "sandlot"
# Attributes every LogRecord has; anything else was passed as ``extra=`` and is kept.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra, "exception"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _formatter(cfg: LogConfig) -> logging.Formatter:
    return JsonFormatter() if cfg.format == "json" else logging.Formatter(TEXT_FORMAT)


def _handler(cfg: LogConfig, path: str | None) -> logging.Handler:
    if path is None:
        return logging.StreamHandler()
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    return logging.handlers.RotatingFileHandler(
        target, maxBytes=cfg.file_max_bytes, backupCount=cfg.file_backup_count,
        encoding="utf-8")


def level_of(cfg: LogConfig) -> int:
    level = logging.getLevelName(cfg.level.upper())
    if not isinstance(level, int):
        raise ValueError(f"[log] level {cfg.level!r} is not a logging level "
                         "(DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    return level


def configure(cfg: LogConfig) -> None:
    """Set up the root logger and uvicorn's loggers (uvicorn is started with no config)."""
    level = level_of(cfg)
    main_path = access_path = None
    if cfg.file_enabled:
        main_path = cfg.file_path or str(DEFAULT_DIR / "server.log")
        access_path = cfg.access_file_path or str(DEFAULT_DIR / "access.log")
    main = _handler(cfg, main_path)
    main.setFormatter(_formatter(cfg))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(main)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(level)
    access = logging.getLogger("uvicorn.access")
    access.setLevel(level)
    if access_path is not None:
        handler = _handler(cfg, access_path)
        handler.setFormatter(_formatter(cfg))
        access.addHandler(handler)
        access.propagate = False
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))  # one per proxied request
