"""Snapshot layers of the OCI runtime: a sandbox's upper dir committed as a read-only layer.

A snapshot is ``data_dir/snapshots/<id>/``: ``layer/`` (a copy of the sandbox's overlay upper
dir, whiteouts and opaque-dir xattrs kept) and ``meta.json`` (the lower dirs it sits on and
the image config to run it with). The image's layers (and a parent snapshot's layer) are
referenced, never copied, so a sandbox created from a snapshot mounts
``[layer, *parent lower dirs]``.

Users are tracked on disk (``users/<sandbox id>`` and ``children/<snapshot id>``), so a delete
of a snapshot a sandbox or a later snapshot still stands on is refused (409) across restarts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

from sandlot.errors import Conflict, NotFound, RuntimeFailure
from sandlot.images.model import Image, ImageConfig

_META = "meta.json"


class SnapshotLayers:
    """The snapshot directories under ``root`` (see module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        for leftover in root.glob(".tmp-*"):  # a commit interrupted by a crash
            shutil.rmtree(leftover, ignore_errors=True)

    def _dir(self, snapshot_id: str) -> Path:
        if "/" in snapshot_id or snapshot_id.startswith("."):
            raise NotFound(f"snapshot {snapshot_id} not found", code="SNAPSHOT::NOT_FOUND")
        return self.root / snapshot_id

    def exists(self, snapshot_id: str) -> bool:
        return (self._dir(snapshot_id) / _META).is_file()

    def commit(self, snapshot_id: str, upper: Path, base: Image, parent: str | None) -> None:
        """Copy ``upper`` into a new layer over ``base``'s lower dirs (blocking: a thread)."""
        final = self._dir(snapshot_id)
        tmp = self.root / f".tmp-{snapshot_id}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        # cp -a keeps owners, modes, times, device nodes (overlay whiteouts are 0:0 char
        # devices) and xattrs (trusted.overlay.opaque); reflinks where the filesystem has them.
        done = subprocess.run(
            ["cp", "-a", "--reflink=auto", f"{upper}/.", str(tmp / "layer")],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeFailure(f"copying the sandbox's changes failed: {done.stderr.strip()}")
        meta = {
            "base_image": base.name,
            "base_image_id": base.id,
            "lower_dirs": [str(d) for d in base.lower_dirs],
            "config": asdict(base.config),
            "parent": parent,
        }
        (tmp / _META).write_text(json.dumps(meta))
        (tmp / "users").mkdir()
        (tmp / "children").mkdir()
        os.replace(tmp, final)
        if parent is not None and self.exists(parent):
            (self._dir(parent) / "children" / snapshot_id).touch()

    def image(self, snapshot_id: str) -> Image:
        """The snapshot as an image: its layer over the lower dirs it was taken on."""
        d = self._dir(snapshot_id)
        try:
            meta = json.loads((d / _META).read_text())
        except FileNotFoundError:
            raise NotFound(f"snapshot {snapshot_id} not found",
                           code="SNAPSHOT::NOT_FOUND") from None
        lowers = [d / "layer", *(Path(p) for p in meta["lower_dirs"])]
        missing = [str(p) for p in lowers if not p.is_dir()]
        if missing:
            raise RuntimeFailure(f"snapshot {snapshot_id} is damaged: {', '.join(missing)} "
                                 "is gone (was its base image removed?)")
        return Image(name=f"snapshot/{snapshot_id}", id=f"snapshot:{snapshot_id}",
                     lower_dirs=lowers, config=ImageConfig(**meta["config"]))

    def parent_of(self, image: Image) -> str | None:
        """The snapshot id ``image`` is, when it is one (a snapshot of a snapshot's child)."""
        prefix = "snapshot:"
        return image.id[len(prefix):] if image.id.startswith(prefix) else None

    def add_user(self, snapshot_id: str, sandbox_id: str) -> None:
        (self._dir(snapshot_id) / "users" / sandbox_id).touch()

    def remove_user(self, sandbox_id: str) -> None:
        for mark in self.root.glob(f"*/users/{sandbox_id}"):
            mark.unlink(missing_ok=True)

    def users(self, snapshot_id: str) -> list[str]:
        d = self._dir(snapshot_id) / "users"
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def delete(self, snapshot_id: str, live_sandboxes: set[str]) -> None:
        """Remove the snapshot; 409 while a live sandbox or a later snapshot stands on it."""
        d = self._dir(snapshot_id)
        if not d.exists():
            return
        self.refuse_if_used(snapshot_id, live_sandboxes)
        meta = json.loads((d / _META).read_text()) if (d / _META).exists() else {}
        parent = meta.get("parent")
        doomed = self.root / f".tmp-del-{snapshot_id}"
        os.replace(d, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        if parent:
            (self.root / parent / "children" / snapshot_id).unlink(missing_ok=True)

    def refuse_if_used(self, snapshot_id: str, live_sandboxes: set[str]) -> None:
        """409 while a live sandbox or a later snapshot stands on the snapshot."""
        d = self._dir(snapshot_id)
        if not d.exists():
            return
        for user in self.users(snapshot_id):
            if user not in live_sandboxes:  # its sandbox is gone (e.g. a crash): forget it
                (d / "users" / user).unlink(missing_ok=True)
        users = self.users(snapshot_id)
        children = sorted(p.name for p in (d / "children").iterdir()
                          if self.exists(p.name)) if (d / "children").is_dir() else []
        if users or children:
            what = [f"sandbox {u}" for u in users] + [f"snapshot {c}" for c in children]
            raise Conflict(f"snapshot {snapshot_id} is in use by {', '.join(what)}; delete "
                           "those first", code="SNAPSHOT::DELETE_CONFLICT")
