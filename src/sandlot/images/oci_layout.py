"""Read an OCI image layout directory (what skopeo writes): manifest, config and layers."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.errors import ImagePullError
from sandlot.images.model import ImageConfig

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
REF_ANNOTATION = "org.opencontainers.image.ref.name"
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


def host_arch() -> str:
    machine = platform.machine()
    return _ARCH.get(machine, machine)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_index(manifest: dict[str, Any]) -> bool:
    return manifest.get("mediaType") in INDEX_TYPES or (
        "manifests" in manifest and "layers" not in manifest
    )


def pick_platform(index: dict[str, Any]) -> dict[str, Any]:
    """The descriptor in a manifest list that runs on this host (linux/<arch>)."""
    arch = host_arch()
    for desc in index.get("manifests", []):
        plat = desc.get("platform") or {}
        if plat.get("os", "linux") == "linux" and plat.get("architecture", arch) == arch:
            return desc
    raise ImagePullError(f"image has no variant for linux/{arch}")


def parse_config(raw: dict[str, Any]) -> tuple[ImageConfig, str | None]:
    """Turn an OCI/Docker image config JSON into ImageConfig (and its creation time)."""
    cfg = raw.get("config") or {}
    return (
        ImageConfig(
            env=list(cfg.get("Env") or []),
            entrypoint=list(cfg["Entrypoint"]) if cfg.get("Entrypoint") else None,
            cmd=list(cfg["Cmd"]) if cfg.get("Cmd") else None,
            working_dir=cfg.get("WorkingDir") or None,
            user=cfg.get("User") or None,
        ),
        raw.get("created"),
    )


@dataclass(frozen=True)
class LayoutImage:
    """One image inside a layout: its manifest digest, config and layer blob paths."""

    manifest_digest: str
    config: ImageConfig
    created: str | None
    layers: list[Path]  # bottom-most first (application order)
    total_size: int


class OciLayout:
    def __init__(self, path: Path):
        self.path = path

    def blob(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        if not hexdigest or "/" in hexdigest or "/" in algo or ".." in digest:
            raise ImagePullError(f"bad blob digest {digest!r} in image layout")
        return self.path / "blobs" / algo / hexdigest

    def _json(self, digest: str) -> dict[str, Any]:
        try:
            return json.loads(self.blob(digest).read_bytes())
        except (OSError, ValueError) as exc:
            raise ImagePullError(f"image layout blob {digest} unreadable: {exc}") from exc

    def image(self, ref_name: str | None = None) -> LayoutImage:
        """The image tagged ``ref_name`` in the layout (or its only image)."""
        try:
            index = json.loads((self.path / "index.json").read_text())
        except (OSError, ValueError) as exc:
            raise ImagePullError(f"not an OCI image layout: {exc}") from exc
        manifests = index.get("manifests") or []
        if ref_name is not None:
            named = [
                m for m in manifests if (m.get("annotations") or {}).get(REF_ANNOTATION) == ref_name
            ]
            manifests = named or manifests
        if not manifests:
            raise ImagePullError("image layout holds no image")
        if len(manifests) > 1:
            raise ImagePullError(
                f"image layout holds {len(manifests)} images; cannot tell which one to use"
            )
        desc = manifests[0]
        manifest = self._json(desc["digest"])
        while is_index(manifest):
            desc = pick_platform(manifest)
            manifest = self._json(desc["digest"])
        config_desc = manifest.get("config") or {}
        config, created = parse_config(self._json(config_desc["digest"]))
        layers = [self.blob(layer["digest"]) for layer in manifest.get("layers", [])]
        total = sum(int(layer.get("size", 0)) for layer in manifest.get("layers", []))
        return LayoutImage(
            manifest_digest=desc["digest"],
            config=config,
            created=created,
            layers=layers,
            total_size=total,
        )
