"""Jupyter API settings, from execd's environment like the rest of the code service's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_SECRET_PATTERNS = (
    "*SECRET*", "*TOKEN*", "*PASSWORD*", "*PASSWD*", "*API_KEY*", "*APIKEY*", "*CREDENTIAL*",
    "*PRIVATE_KEY*", "AWS_*", "AZURE_*", "GOOGLE_APPLICATION_CREDENTIALS",
)


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.replace(";", ",").split(",") if p.strip())


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from exc
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {raw!r}")
    return value


@dataclass(frozen=True)
class JupyterApiSettings:
    # Serve the API at all (on the code service's ready port).
    enabled: bool = True
    # Tokens accepted besides the one derived from execd's (``JUPYTER_TOKEN``, as the reference
    # image sets it); with no token at all the API is open (a development execd without a token).
    extra_tokens: tuple[str, ...] = ()
    # A Python kernelspec whose kernels get an environment without variables matching
    # ``stripped_env`` (the seed-002 runner's "docsgpt-python"); "" = none.
    stripped_kernel: str = ""
    stripped_env: tuple[str, ...] = DEFAULT_SECRET_PATTERNS
    # Kernels idle (not busy, no message either way) for longer are shut down; 0 = never.
    cull_idle: float = 0.0
    cull_interval: float = 30.0
    cull_connected: bool = False
    # The kernelspec a start request without a name gets.
    default_kernel: str = "python3"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JupyterApiSettings:
        env = os.environ if env is None else env
        cull = _seconds(env, "SANDLOT_JUPYTER_CULL_IDLE", 0.0)
        flag = env.get("SANDLOT_JUPYTER_API", "1").strip().lower()
        if flag not in ("1", "0", "true", "false", "yes", "no", "on", "off", ""):
            raise ValueError(f"SANDLOT_JUPYTER_API must be 1 or 0, got {flag!r}")
        token = env.get("JUPYTER_TOKEN", "").strip()
        return cls(
            enabled=flag in ("1", "true", "yes", "on", ""),
            extra_tokens=(token,) if token else (),
            stripped_kernel=env.get("SANDLOT_JUPYTER_STRIPPED_KERNEL", "").strip(),
            stripped_env=_split(env.get("SANDLOT_JUPYTER_STRIPPED_ENV", ""))
            or DEFAULT_SECRET_PATTERNS,
            cull_idle=cull,
            cull_interval=_seconds(env, "SANDLOT_JUPYTER_CULL_INTERVAL",
                                   min(30.0, cull / 2) if cull else 30.0),
            cull_connected=env.get("SANDLOT_JUPYTER_CULL_CONNECTED", "").strip().lower()
            in ("1", "true", "yes", "on"),
            default_kernel=env.get("SANDLOT_JUPYTER_DEFAULT_KERNEL", "python3").strip()
            or "python3",
        )
