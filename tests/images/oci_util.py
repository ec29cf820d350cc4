"""Test helpers: write OCI image layouts by hand and tar up directories as layers."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


def _put_blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_layout(
    layout: Path,
    layers: list[bytes],
    *,
    config: dict[str, Any] | None = None,
    ref_name: str = "latest",
) -> str:
    """Write a one-image OCI layout from uncompressed layer tarballs; return manifest digest."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    diff_ids = ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers]
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2024-01-01T00:00:00Z",
        "config": config or {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg_desc = _put_blob(layout, json.dumps(cfg).encode())
    layer_descs = [{"mediaType": LAYER_TYPE, **_put_blob(layout, x)} for x in layers]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg_desc},
        "layers": layer_descs,
    }
    man_desc = _put_blob(layout, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **man_desc,
                "annotations": {"org.opencontainers.image.ref.name": ref_name},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return man_desc["digest"]


class TarBuilder:
    """Build a tarball in memory, entry by entry (for hand-crafted, even malicious, layers)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tf = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.mode = mode
        ti.mtime = 1_700_000_000
        return ti

    def dir(self, name: str, mode: int = 0o755) -> TarBuilder:
        self.tf.addfile(self._info(name, tarfile.DIRTYPE, mode))
        return self

    def file(
        self, name: str, data: bytes = b"", mode: int = 0o644, uid: int = 0, gid: int = 0
    ) -> TarBuilder:
        ti = self._info(name, tarfile.REGTYPE, mode)
        ti.size, ti.uid, ti.gid = len(data), uid, gid
        self.tf.addfile(ti, io.BytesIO(data))
        return self

    def symlink(self, name: str, target: str) -> TarBuilder:
        ti = self._info(name, tarfile.SYMTYPE, 0o777)
        ti.linkname = target
        self.tf.addfile(ti)
        return self

    def hardlink(self, name: str, target: str) -> TarBuilder:
        ti = self._info(name, tarfile.LNKTYPE, 0o644)
        ti.linkname = target
        self.tf.addfile(ti)
        return self

    def device(self, name: str, major: int = 1, minor: int = 3) -> TarBuilder:
        ti = self._info(name, tarfile.CHRTYPE, 0o666)
        ti.devmajor, ti.devminor = major, minor
        self.tf.addfile(ti)
        return self

    def bytes(self) -> bytes:
        self.tf.close()
        return self.buf.getvalue()


def tar_directory(src: Path, dest: Path) -> Path:
    """Tar ``src`` the way a layer or `docker export` would (owners, modes, xattrs kept)."""
    subprocess.run(
        ["tar", "-C", str(src), "--numeric-owner", "--xattrs", "-cf", str(dest), "."],
        check=True,
    )
    return dest
