"""Code-interpreter settings, read from the environment execd starts with.

execd is configured by the runtime through environment variables (it has no config file inside the
sandbox), so every knob here has a ``SANDLOT_CODE_*`` variable and a safe default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_KERNEL_DIRS = (
    "/usr/local/share/jupyter/kernels",
    "/usr/share/jupyter/kernels",
    "/opt/conda/share/jupyter/kernels",
)


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.replace(";", ",").split(",") if p.strip())


def _num(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc


@dataclass(frozen=True)
class CodeSettings:
    """What the code service needs to know; build with :meth:`from_env`."""

    # Languages to pre-start one idle kernel for ("" = none). None by default: a warm kernel
    # costs ~60 MB, so only images made for code (the code-interpreter recipe) ask for one.
    prestart: tuple[str, ...] = ()
    # Restrict the offered languages (empty = everything discovered).
    languages: tuple[str, ...] = ()
    # fnmatch patterns (case-insensitive) of environment variable names kept out of kernels.
    strip_env: tuple[str, ...] = ()
    # Per-execution cap on stdout+stderr bytes; past it output is dropped behind a marker.
    max_output_bytes: int = 1 << 20
    # Cap on one result MIME value (base64 images included).
    max_result_bytes: int = 8 << 20
    # Seconds before a run is interrupted (0 = no limit); a request may ask for less.
    exec_timeout: float = 0.0
    # Seconds between SSE keep-alives while a run is quiet.
    keepalive: float = 15.0
    # Seconds a kernel may take to start.
    start_timeout: float = 60.0
    # Where to look for kernelspecs (the image's standard locations first).
    kernel_dirs: tuple[str, ...] = field(default_factory=lambda: DEFAULT_KERNEL_DIRS)
    # Working directory of new contexts ("" = execd's own).
    default_cwd: str = ""
    # Port opened on 127.0.0.1 once kernels are ready; the released SDK's strict readiness check
    # probes it (the reference image's Jupyter port). 0 disables.
    ready_port: int = 44771
    # execd's access token, from which the Jupyter API's token is derived (not from the env:
    # execd removes it from its environment at start).
    execd_token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CodeSettings:
        env = os.environ if env is None else env
        dirs = _split(env.get("SANDLOT_CODE_KERNEL_DIRS", "")) or (
            *DEFAULT_KERNEL_DIRS,
            os.path.join(os.path.expanduser("~"), ".local/share/jupyter/kernels"),
            os.path.join(sys.prefix, "share/jupyter/kernels"),
        )
        ready = env.get("SANDLOT_CODE_READY_PORT", env.get("JUPYTER_PORT", "44771")).strip()
        return cls(
            prestart=_split(env.get("SANDLOT_CODE_PRESTART", "")),
            languages=_split(env.get("SANDLOT_CODE_LANGUAGES", "")),
            strip_env=_split(env.get("SANDLOT_CODE_STRIP_ENV", "")),
            max_output_bytes=int(_num(env, "SANDLOT_CODE_MAX_OUTPUT_BYTES", 1 << 20)),
            max_result_bytes=int(_num(env, "SANDLOT_CODE_MAX_RESULT_BYTES", 8 << 20)),
            exec_timeout=_num(env, "SANDLOT_CODE_EXEC_TIMEOUT", 0.0),
            keepalive=_num(env, "SANDLOT_CODE_KEEPALIVE", 15.0),
            start_timeout=_num(env, "SANDLOT_CODE_START_TIMEOUT", 60.0),
            kernel_dirs=dirs,
            default_cwd=env.get("SANDLOT_CODE_CWD", ""),
            ready_port=int(ready) if ready.isdigit() else 0,
        )
