"""Docker-archive image files made from a directory: the execd bundle image, test images.

A cluster's nodes get images from a registry or from ``ctr images import``; sandlot builds
the small image that carries its execd bundle (``bundle_image``) from a directory on the
server's disk. The docker-archive layout (``manifest.json``, a config with the layer's
``diff_id``, one layer tar) is written with ``tarfile`` directly: the tools that could do it
(umoci, skopeo, buildah) either cannot start from a plain directory or need a daemon, and
the format is three small JSON documents around one tar.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
_CHUNK = 1 << 20


def host_arch() -> str:
    return _ARCHES.get(platform.machine(), platform.machine())


def _layer(source: Path, prefix: str, dest: Path) -> str:
    """Tar ``source`` (numeric owners, symlinks kept) under ``prefix``; its sha256."""
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uname = info.gname = ""
        return info

    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        if prefix:
            tar.add(source, arcname=prefix, filter=normalise)
        else:
            for entry in sorted(os.listdir(source)):
                tar.add(source / entry, arcname=entry, filter=normalise)
    return _file_digest(dest)


def gnu_tar_layer(source: Path, prefix: str, dest: Path) -> str:
    """``_layer`` by GNU tar, for multi-GB rootfs trees (server and test images), where
    ``tarfile`` takes minutes; ``prefix`` is not supported (the tree is the whole image)."""
    if prefix:
        raise ValueError("gnu_tar_layer writes a whole rootfs: prefix must be empty")
    subprocess.run(["tar", "-C", str(source), "--numeric-owner", "--xattrs", "-cf", str(dest),
                    "."], check=True)
    return _file_digest(dest)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def write_docker_archive(
    out: Path, tag: str, rootfs: Path, *, prefix: str = "", env: list[str] | None = None,
    working_dir: str | None = None, cmd: list[str] | None = None,
    layer_writer: Callable[[Path, str, Path], str] = _layer,
) -> None:
    """Write a one-layer image named ``tag`` whose files are ``rootfs`` (under ``prefix``).

    Written to a temporary file beside ``out`` and renamed, so ``out`` is whole or absent.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".archive-") as work:
        layer = Path(work) / "layer.tar"
        diff_id = layer_writer(rootfs, prefix, layer)
        config = {
            "architecture": host_arch(), "os": "linux",
            "config": {"Env": env or [], "WorkingDir": working_dir or "", "Cmd": cmd},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
        config_raw = json.dumps(config).encode()
        config_name = hashlib.sha256(config_raw).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
        partial = Path(work) / "image.tar"
        with tarfile.open(partial, "w") as tar:
            tar.add(layer, arcname="layer.tar")
            _add_bytes(tar, config_name, config_raw)
            _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        shutil.move(partial, out)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
