"""The base image's root filesystem, for the baselines that must run on the same image.

Resolved through sandlot's image store (the ``Image`` model's read-only ``lower_dirs``); a
multi-layer image is merged with a read-only overlay mount made here and unmounted on close.
``SANDLOT_BENCH_ROOTFS=/path`` overrides it (any unpacked rootfs directory).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


class RootfsUnavailable(RuntimeError):
    pass


def _lookup(cache_dir: Path, name: str) -> Any:
    from sandlot.images.store import ImageStore

    image = ImageStore(cache_dir / "images").get(name)
    if image is None:
        raise RootfsUnavailable(f"image {name!r} not found in {cache_dir / 'images'}")
    return image


class Rootfs:
    """One directory holding the image's merged rootfs (mounted here if it must be)."""

    def __init__(self, cache_dir: Path, workdir: Path, image: str = "base"):
        self.cache_dir = cache_dir
        self.workdir = workdir
        self.image = image
        self.mounted: Path | None = None
        self.path: Path | None = None

    def resolve(self) -> Path:
        if self.path is not None:
            return self.path
        override = os.environ.get("SANDLOT_BENCH_ROOTFS")
        if override:
            self.path = Path(override)
            return self.path
        try:
            image = _lookup(self.cache_dir, self.image)
        except (ImportError, AttributeError) as exc:
            raise RootfsUnavailable(f"sandlot.images.store not usable: {exc}") from exc
        lowers = [Path(p) for p in image.lower_dirs]
        if not lowers:
            raise RootfsUnavailable(f"image {self.image!r} has no layers")
        if len(lowers) == 1:
            self.path = lowers[0]
            return self.path
        merged = self.workdir / "rootfs-merged"
        merged.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             "ro,lowerdir=" + ":".join(str(p) for p in lowers), str(merged)],
            check=True, capture_output=True,
        )
        self.mounted = merged
        self.path = merged
        return merged

    def close(self) -> None:
        if self.mounted is not None:
            subprocess.run(["umount", str(self.mounted)], capture_output=True, check=False)
            self.mounted = None
