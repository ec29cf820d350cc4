"""What the runtime needs to know about a local image: its layers and its run config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config that decide how a container starts."""

    env: list[str] = field(default_factory=list)  # "KEY=value" entries
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    working_dir: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Image:
    """A locally stored, unpacked image, ready to be an overlayfs lower layer.

    ``lower_dirs`` are read-only directories, top-most layer first (overlayfs ``lowerdir``
    order). The runtime never writes into them.
    """

    name: str  # the reference it was asked for / tagged as, e.g. "base" or "host:5000/py:3.12"
    id: str  # content digest ("sha256:...")
    lower_dirs: list[Path]
    config: ImageConfig = field(default_factory=ImageConfig)
    size_bytes: int = 0
    created: str | None = None  # RFC 3339


@dataclass(frozen=True)
class RegistryAuth:
    username: str
    password: str
