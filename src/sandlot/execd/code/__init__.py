"""Code contexts on real Jupyter kernels (and a native Node.js context), as an execd extension."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from . import identity, kernelstdio, versions
from .service import CodeService
from .settings import CodeSettings

__all__ = ["CodeService", "CodeSettings", "build_extension"]


def build_extension(execd_settings: Any = None) -> CodeService:
    """The extension execd mounts; new contexts start in execd's working directory by default."""
    versions.apply(os.environ)  # before kernels are found: *_VERSION picks their interpreters
    settings = CodeSettings.from_env()
    workdir = getattr(execd_settings, "workdir", None)
    if not settings.default_cwd and workdir and "SANDLOT_CODE_CWD" not in os.environ:
        settings = dataclasses.replace(settings, default_cwd=str(workdir))
    token = getattr(execd_settings, "token", None)
    if token:
        settings = dataclasses.replace(settings, execd_token=str(token))
    keepalive = getattr(execd_settings, "keepalive_interval", None)
    if keepalive and "SANDLOT_CODE_KEEPALIVE" not in os.environ:
        settings = dataclasses.replace(settings, keepalive=float(keepalive))
    identity.configure(getattr(execd_settings, "default_uid", None),
                       getattr(execd_settings, "default_gid", None))
    kernelstdio.configure(getattr(execd_settings, "kernel_log", None))
    return CodeService(settings)
