"""Volumes of a Docker sandbox: host binds, and pvc claims as Docker named volumes.

A ``host`` volume, and a ``pvc`` volume with a ``subPath``, is opened without following
links (``hostpath.open_beneath``) and bind-mounted from that descriptor onto
``data_dir/docker-volumes/<sandbox>/<name>`` (remounted ``nosuid,nodev``); the engine binds
that staged directory into the container. So the path dockerd follows is one only the server
can change: a link swapped in after the request's check cannot redirect it. This needs the
engine on this host and in this mount namespace, as the rest of this backend does.

A ``pvc`` volume is the Docker named volume called ``claimName`` (as the reference server maps
it): made on first use when ``createIfNotExists`` (labelled with this sandlot's owner id), and
mounted by the engine itself, or through its local-driver ``Mountpoint`` when a ``subPath``
selects a directory inside it. The claims a sandbox holds are written to its staging folder
(``claims.json``) before anything is made, so a delete, a failed create, a restart and a
container removed behind the server's back all release them. A volume made by a request with
``deleteOnSandboxTermination`` is removed when its last sandlot user ends; one that existed
before is never removed (as upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
from pathlib import Path
from typing import Any

from docker.errors import APIError, DockerException
from docker.errors import NotFound as DockerNotFound
from docker.types import Mount

from sandlot.errors import InvalidRequest, RuntimeFailure
from sandlot.runtime.base import VolumeSpec
from sandlot.runtime.docker.engine import Engine
from sandlot.runtime.oci import mounts
from sandlot.runtime.oci.volumes import bind_fd, check_sub_path, host_root, open_source

LABEL_OWNER = "io.sandlot.owner"
LABEL_DELETE = "io.sandlot.delete-on-termination"  # made by a request asking for removal
CLAIMS_FILE = "claims.json"
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 0x2, 0x4, 0x20, 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def _bad(code: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, code=f"VOLUME::{code}")


def _harden(target: Path) -> None:
    """nosuid,nodev on a staged bind: no set-uid programs or devices come in through it."""
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
    if _libc.mount(None, str(target).encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"remount {target} nosuid,nodev: {os.strerror(err)}")


class DockerVolumes:
    """Volume mounts of the Docker backend's sandboxes (see module docstring)."""

    def __init__(self, engine: Engine, owner: str, root: Path, data_dir: Path,
                 allowed_host_paths: list[str]) -> None:
        self.engine = engine
        self.owner = owner
        self.root = root
        self.data_dir = data_dir
        self.allowed_host_paths = list(allowed_host_paths)
        # Serialises making and removing claims in this process (a removal never races a
        # create that is about to use the same volume).
        self._lock = asyncio.Lock()

    # -- checks before a create is accepted ----------------------------------------------

    async def check(self, specs: list[VolumeSpec]) -> None:
        """A missing claim that may not be made, or a subPath the driver cannot give: 400."""
        for v in specs:
            if v.kind != "pvc":
                continue
            info = await self._inspect(v.source)
            if info is None:
                if not v.options.get("createIfNotExists", True):
                    raise _bad("PVC_NOT_FOUND",
                               f"volume {v.name!r}: Docker named volume {v.source!r} does "
                               "not exist and createIfNotExists is false")
                continue
            if v.sub_path:
                await asyncio.to_thread(check_sub_path, v, self._mountpoint(v, info))

    # -- create ---------------------------------------------------------------------------

    async def mounts(self, sandbox_id: str, specs: list[VolumeSpec]) -> list[Mount]:
        """The engine mounts for ``specs``; staged binds and claims are recorded first.

        On failure what was made stays for ``release`` (the caller's clean-up calls it).
        """
        folder = self.root / sandbox_id
        await asyncio.to_thread(self._prepare_folder, folder, specs)
        out: list[Mount] = []
        for v in specs:
            sub = (v.sub_path or "").strip("/")
            if v.kind == "pvc":
                info = await self._ensure(v)
                if not sub:
                    out.append(Mount(target=v.mount_path, source=v.source, type="volume",
                                     read_only=v.read_only))
                    continue
                base, rel = self._mountpoint(v, info), sub
            elif v.kind == "host":
                base, rel = host_root(v.source, self.allowed_host_paths, self.data_dir)
                rel = os.path.join(rel, sub) if sub else rel
            else:
                raise _bad("UNSUPPORTED_BACKEND", f"volume {v.name!r}: {v.kind} volumes are "
                                                  "not supported by the docker runtime")
            staged = await asyncio.to_thread(self._stage, v, base, rel, folder)
            out.append(Mount(target=v.mount_path, source=str(staged), type="bind",
                             read_only=v.read_only))
        return out

    @staticmethod
    def _prepare_folder(folder: Path, specs: list[VolumeSpec]) -> None:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        claims = sorted({v.source for v in specs if v.kind == "pvc"})
        (folder / CLAIMS_FILE).write_text(json.dumps(claims))

    @staticmethod
    def _stage(v: VolumeSpec, base: str, rel: str, folder: Path) -> Path:
        fd = open_source(v, base, rel)
        target = folder / v.name
        try:
            target.mkdir(mode=0o700)
            bind_fd(fd, target)
        finally:
            os.close(fd)
        _harden(target)
        return target

    def _mountpoint(self, v: VolumeSpec, info: dict[str, Any]) -> str:
        """Where a local-driver volume's files are on this host (for a subPath bind)."""
        driver = str(info.get("Driver") or "")
        mountpoint = str(info.get("Mountpoint") or "")
        if driver != "local" or not mountpoint:
            raise _bad("PVC_SUBPATH_UNSUPPORTED_DRIVER",
                       f"volume {v.name!r}: subPath needs a Docker named volume of the "
                       f"'local' driver with a host directory; {v.source!r} uses driver "
                       f"{driver or 'unknown'!r}")
        return mountpoint

    async def _inspect(self, name: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self.engine.call(self.engine.api.inspect_volume, name)
        except DockerNotFound:
            return None
        except DockerException as exc:
            raise RuntimeFailure(f"the Docker engine cannot inspect volume {name!r}: "
                                 f"{exc}") from exc
        return info

    async def _ensure(self, v: VolumeSpec) -> dict[str, Any]:
        async with self._lock:
            info = await self._inspect(v.source)
            if info is not None:
                return info
            if not v.options.get("createIfNotExists", True):
                raise _bad("PVC_NOT_FOUND", f"volume {v.name!r}: Docker named volume "
                                            f"{v.source!r} does not exist and "
                                            "createIfNotExists is false")
            labels = {LABEL_OWNER: self.owner}
            if v.options.get("deleteOnSandboxTermination"):
                labels[LABEL_DELETE] = "true"
            try:
                made: dict[str, Any] = await self.engine.call(
                    self.engine.api.create_volume, name=v.source, driver="local",
                    labels=labels)
            except DockerException as exc:
                raise RuntimeFailure(f"volume {v.name!r}: the Docker engine cannot make named "
                                     f"volume {v.source!r}: {exc}") from exc
            return made

    # -- delete ---------------------------------------------------------------------------

    async def release(self, sandbox_id: str) -> list[str]:
        """Unmount the staged binds and give up the sandbox's claims; returns volumes removed.

        Call once its container is gone. Sandboxes without volumes cost one ``stat``.
        """
        folder = self.root / sandbox_id
        if not folder.is_dir():
            return []
        async with self._lock:
            claims = await asyncio.to_thread(self._unstage, folder)
            removed = [c for c in claims if await self._remove_if_unused(c, sandbox_id)]
            with contextlib.suppress(FileNotFoundError):
                (folder / CLAIMS_FILE).unlink()
            folder.rmdir()
        return removed

    @staticmethod
    def _unstage(folder: Path) -> list[str]:
        for mp in mounts.mounts_under(folder):
            mounts.unmount(Path(mp))
        left = mounts.mounts_under(folder)
        if left:
            raise OSError(f"volumes still mounted below {folder}: {left}")
        for d in folder.iterdir():
            if d.is_dir():
                d.rmdir()  # an empty mount point: never a volume's files
        return _claims_of(folder)

    async def _remove_if_unused(self, claim: str, leaving: str) -> bool:
        info = await self._inspect(claim)
        labels = (info or {}).get("Labels") or {}
        if labels.get(LABEL_OWNER) != self.owner or labels.get(LABEL_DELETE) != "true":
            return False
        if any(claim in _claims_of(f) for f in self.root.iterdir()
               if f.is_dir() and f.name != leaving):
            return False  # another sandlot sandbox still holds it (perhaps through a subPath)
        try:
            await self.engine.call(self.engine.api.remove_volume, claim)
        except DockerNotFound:
            return False
        except APIError as exc:
            if exc.status_code == 409:
                return False  # a container (ours or not) still uses it: its last user removes it
            raise RuntimeFailure(f"cannot remove Docker named volume {claim!r}: {exc}") from exc
        return True

    def holders(self) -> set[str]:
        """Sandbox ids with a staging folder (volumes or claims not yet released)."""
        if not self.root.is_dir():
            return set()
        return {f.name for f in self.root.iterdir() if f.is_dir()}


def _claims_of(folder: Path) -> list[str]:
    try:
        data = json.loads((folder / CLAIMS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [str(c) for c in data] if isinstance(data, list) else []
