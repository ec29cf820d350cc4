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
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
_CHUNK = 1 << 20


def host_arch() -> str:
    return _ARCHES.get(platform.machine(), platform.machine())


class LayerSink(io.BufferedIOBase):
    """Where a layer's bytes go: straight into the outer archive, hashed and counted on the
    way, so a multi-GB layer is written once and never re-read for its digest or copied."""

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__()
        self._fh = fh
        self._digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        data = memoryview(data)
        self._digest.update(data)
        self._fh.write(data)
        self.size += data.nbytes
        return data.nbytes

    def tell(self) -> int:  # tarfile asks where it starts
        return self.size

    def diff_id(self) -> str:
        return "sha256:" + self._digest.hexdigest()


def _layer(source: Path, prefix: str, out: LayerSink) -> None:
    """Tar ``source`` (numeric owners, symlinks kept) under ``prefix`` to ``out``."""
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if prefix:
            tar.add(source, arcname=prefix, filter=normalise)
        else:
            for entry in sorted(os.listdir(source)):
                tar.add(source / entry, arcname=entry, filter=normalise)


def gnu_tar_layer(source: Path, prefix: str, out: LayerSink) -> None:
    """``_layer`` by GNU tar, for multi-GB rootfs trees (server and test images), where
    ``tarfile`` takes minutes; ``prefix`` is not supported (the tree is the whole image).
    GNU tar writes to a pipe that is copied to ``out`` as it comes (no layer file)."""
    if prefix:
        raise ValueError("gnu_tar_layer writes a whole rootfs: prefix must be empty")
    argv = ["tar", "-C", str(source), "--numeric-owner", "--xattrs", "-cf", "-", "."]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(_CHUNK):
            out.write(chunk)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)


def write_docker_archive(
    out: Path, tag: str, rootfs: Path, *, prefix: str = "", env: list[str] | None = None,
    working_dir: str | None = None, cmd: list[str] | None = None,
    layer_writer: Callable[[Path, str, LayerSink], None] = _layer,
) -> None:
    """Write a one-layer image named ``tag`` whose files are ``rootfs`` (under ``prefix``).

    The layer is the archive's first member: its header is written last, once the layer's
    size is known, over a block kept for it. Written to a temporary file beside ``out`` and
    renamed, so ``out`` is whole or absent.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".archive-") as work:
        partial = Path(work) / "image.tar"
        with open(partial, "wb") as fh:
            fh.write(bytes(tarfile.BLOCKSIZE))
            sink = LayerSink(fh)
            layer_writer(rootfs, prefix, sink)
            _pad(fh, sink.size)
            end = fh.tell()
            fh.seek(0)
            fh.write(_header("layer.tar", sink.size))
            fh.seek(end)
            config = {
                "architecture": host_arch(), "os": "linux",
                "config": {"Env": env or [], "WorkingDir": working_dir or "", "Cmd": cmd},
                "rootfs": {"type": "layers", "diff_ids": [sink.diff_id()]},
            }
            config_raw = json.dumps(config).encode()
            config_name = hashlib.sha256(config_raw).hexdigest() + ".json"
            manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
            _add_bytes(fh, config_name, config_raw)
            _add_bytes(fh, "manifest.json", json.dumps(manifest).encode())
            fh.write(bytes(2 * tarfile.BLOCKSIZE))  # end of archive
        os.replace(partial, out)


def _header(name: str, size: int) -> bytes:
    """One 512-byte header block (GNU format: sizes past 8 GiB stay in the one block)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    block = info.tobuf(format=tarfile.GNU_FORMAT)
    if len(block) != tarfile.BLOCKSIZE:
        raise ValueError(f"archive member name too long: {name!r}")
    return block


def _pad(fh: BinaryIO, size: int) -> None:
    fh.write(bytes(-size % tarfile.BLOCKSIZE))


def _add_bytes(fh: BinaryIO, name: str, data: bytes) -> None:
    fh.write(_header(name, len(data)))
    fh.write(data)
    _pad(fh, len(data))
