"""The docker-archive writer: one layer whose diff_id is its sha256, by tarfile or GNU tar."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from sandlot.runtime.kubernetes.archive import LayerSink, gnu_tar_layer, write_docker_archive


def _tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "bin" / "tool", 0o755)
    os.symlink("bin/tool", root / "tool")
    return root


@pytest.mark.parametrize("writer", ["tarfile", "gnu-tar"])
def test_archive_holds_the_tree_and_names_its_layer_by_digest(tmp_path: Path,
                                                              writer: str) -> None:
    rootfs = _tree(tmp_path / "rootfs")
    out = tmp_path / "image.tar"
    extra = {"layer_writer": gnu_tar_layer} if writer == "gnu-tar" else {}
    write_docker_archive(out, "sandlot/test:1", rootfs, cmd=["/tool"], **extra)
    with tarfile.open(out) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["sandlot/test:1"]
        config = json.load(archive.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        layer_raw = archive.extractfile("layer.tar").read()  # type: ignore[union-attr]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_raw).hexdigest()]
    assert config["config"]["Cmd"] == ["/tool"]
    (tmp_path / "layer.tar").write_bytes(layer_raw)
    with tarfile.open(tmp_path / "layer.tar") as layer:
        names = {m.name.removeprefix("./"): m for m in layer.getmembers()}
    assert names["bin/tool"].mode & 0o777 == 0o755
    assert names["tool"].issym() and names["tool"].linkname == "bin/tool"


def test_gnu_tar_layer_refuses_a_prefix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefix"):
        gnu_tar_layer(_tree(tmp_path / "rootfs"), "opt/x", LayerSink(io.BytesIO()))
