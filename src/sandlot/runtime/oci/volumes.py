"""Volumes of an OCI sandbox: host directories and pvc (named) volumes, bound in by runc.

In a user-namespaced sandbox the staged bind is an idmapped mount (``owner_bind``), so files
keep host owners on disk and the sandbox's root is the bound directory's owner there.

Each volume's source is opened without following links (``hostpath.open_beneath``) and
bind-mounted from that descriptor onto ``<sandbox dir>/volumes/<name>``, a directory only the
server can change; config.json binds that staged mount into the container. So the path runc
follows is never one a sandbox can redirect, and the sandbox's teardown (which unmounts
everything below its folder) removes the staged mounts with the rest.

pvc volumes are directories ``data_dir/volumes/<claim>/data`` (parents 0700, so only root on
the host reaches them) shared by every sandbox naming the claim; a claim made with a
``storage`` size is a file system of that size mounted there (``pvcdisk``). Who uses a
claim is kept on disk (``users/<container id>``), so a restart loses nothing; a claim
created by a request with ``deleteOnSandboxTermination`` is removed when its last user
ends (claims that existed before are never removed, as upstream). A file lock serialises
use and removal across processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.errors import Conflict, InvalidRequest
from sandlot.runtime.base import VolumeSpec
from sandlot.runtime.hostpath import PathEscape, fd_path, open_beneath
from sandlot.runtime.oci import idmap, mounts, pvcdisk, uidrange
from sandlot.server.quantity import parse_pvc_storage

MS_BIND = 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def _bad(code: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, code=f"VOLUME::{code}")


def open_source(v: VolumeSpec, root: str, relative: str) -> int:
    """An ``O_PATH`` descriptor of volume ``v``'s directory ``root/relative`` (made when
    missing); a link or ``..`` on the way is the 400 of the field that leads out of it."""
    try:
        return open_beneath(root, relative, create=True)
    except PathEscape as exc:
        raise _bad("INVALID_HOST_PATH" if v.kind == "host" else "INVALID_SUB_PATH",
                   f"volume {v.name!r}: {exc.strerror}: a volume may not lead out of "
                   "its directory through a symbolic link") from exc


def check_sub_path(v: VolumeSpec, root: str) -> None:
    """A link a workload left in a volume cannot carry a subPath out of it: 400 at once (a
    missing subPath is made when mounted)."""
    if not v.sub_path:
        return
    try:
        os.close(open_beneath(root, v.sub_path))
    except FileNotFoundError:
        pass
    except PathEscape as exc:
        raise _bad("INVALID_SUB_PATH", f"volume {v.name!r}: subPath {v.sub_path!r}: "
                                       f"{exc.strerror}") from exc


@dataclass(frozen=True)
class StagedVolume:
    spec: VolumeSpec
    staged: Path  # the bind mount below the sandbox folder that config.json names


def pvc_size(v: VolumeSpec) -> int | None:
    """The ``storage`` size a pvc volume asks for, in bytes (None: no limit)."""
    raw = v.options.get("storage")
    return parse_pvc_storage(v.name, str(raw)) if raw not in (None, "") else None


class PvcStore:
    """Named volumes under ``data_dir/volumes`` (see module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _ensure_root(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_root()
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def data_dir(self, claim: str) -> Path:
        return self.root / claim / "data"

    def exists(self, claim: str) -> bool:
        return self.data_dir(claim).is_dir()

    def check(self, v: VolumeSpec) -> None:
        """A missing claim that may not be made, a size other than an existing claim's (409),
        or a subPath through a link: 400."""
        if self.exists(v.source):
            self._check_size(self.root / v.source, pvc_size(v), v.name)
        if not self.exists(v.source):
            if not v.options.get("createIfNotExists", True):
                raise _bad("PVC_NOT_FOUND", f"volume {v.name!r}: pvc {v.source!r} does not "
                                            "exist and createIfNotExists is false")
            return
        check_sub_path(v, str(self.data_dir(v.source)))

    def acquire(self, claim: str, user: str, *, create: bool, delete_when_unused: bool,
                volume_name: str, size: int | None = None) -> Path:
        """Record ``user`` as a user of ``claim`` (made if missing and ``create``, on a file
        system of its own of ``size`` bytes when a size is asked: ``pvcdisk``)."""
        with self._locked():
            base = self.root / claim
            if not self.data_dir(claim).is_dir():
                if not create:
                    raise _bad("PVC_NOT_FOUND",
                               f"volume {volume_name!r}: pvc {claim!r} does not exist and "
                               "createIfNotExists is false")
                self._make(base, user, delete_when_unused, size)
            else:
                self._check_size(base, size, volume_name)
                if pvcdisk.image_of(base).exists():
                    pvcdisk.ensure_mounted(base, self.data_dir(claim))
            (base / "users").mkdir(mode=0o700, exist_ok=True)
            (base / "users" / user).touch(mode=0o600)
            return self.data_dir(claim)

    def _make(self, base: Path, user: str, delete_when_unused: bool, size: int | None) -> None:
        base.mkdir(mode=0o700, exist_ok=True)
        (base / "users").mkdir(mode=0o700, exist_ok=True)
        meta = {"created_by": user, "deleteOnSandboxTermination": delete_when_unused,
                "storage": size}
        (base / "meta.json").write_text(json.dumps(meta))
        # The volume's own root: world-searchable like a fresh docker volume, owned by
        # root, so root in a sandbox (uid 0 on the host without a user namespace)
        # writes to it; see docs/volumes.md for ownership.
        data = self.data_dir(base.name)
        data.mkdir(mode=0o755)
        if size is None:
            return
        try:
            pvcdisk.make(base, data, size)
        except BaseException:
            self._remove(base)  # no half-made claim: the next request makes it afresh
            raise

    def _check_size(self, base: Path, size: int | None, volume_name: str) -> None:
        """A size asked of an existing claim must be the one it was made with: it is not
        resized, and quietly using another size would break the request's promise."""
        if size is None:
            return
        made_with = self._meta(base).get("storage")
        if made_with != size:
            have = f"{made_with} bytes" if made_with else "no size limit"
            raise Conflict(f"volume {volume_name!r}: pvc {base.name!r} exists with {have}; "
                           f"storage {size} bytes applies only when a claim is made",
                           code="VOLUME::PVC_SIZE_MISMATCH")

    def _remove(self, base: Path) -> None:
        pvcdisk.unmount(self.data_dir(base.name))
        shutil.rmtree(base)

    def release(self, user: str) -> list[str]:
        """Forget ``user`` everywhere; remove claims it was the last user of that asked for it.

        Returns the claims removed.
        """
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        with self._locked():
            for base in sorted(self.root.iterdir()):
                mark = base / "users" / user
                if not mark.exists():
                    continue
                mark.unlink()
                if any((base / "users").iterdir()):
                    continue
                if self._meta(base).get("deleteOnSandboxTermination"):
                    self._remove(base)
                    removed.append(base.name)
        return removed

    def users(self, claim: str) -> set[str]:
        d = self.root / claim / "users"
        return {p.name for p in d.iterdir()} if d.is_dir() else set()

    @staticmethod
    def _meta(base: Path) -> dict[str, Any]:
        try:
            data = json.loads((base / "meta.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def host_root(path: str, allowed: list[str], data_dir: Path) -> tuple[str, str]:
    """(resolved allowed prefix, the rest of ``path`` below it) for the first match."""
    resolved, real_data = os.path.realpath(path), os.path.realpath(data_dir)
    for a, b in ((resolved, real_data), (real_data, resolved)):
        if a == b or a.startswith(b.rstrip("/") + "/"):
            raise _bad("HOST_PATH_NOT_ALLOWED", f"host path {path!r} holds or is inside the "
                                                "server's data dir, which is never bound")
    for prefix in allowed:
        real = os.path.realpath(prefix)
        resolved = os.path.realpath(path)
        if resolved == real or resolved.startswith(real.rstrip("/") + "/"):
            return real, os.path.relpath(resolved, real)
    raise _bad("HOST_PATH_NOT_ALLOWED",
               f"host path {path!r} is not under an allowed prefix ({', '.join(allowed)})")


def bind_fd(fd: int, target: Path) -> None:
    if _libc.mount(fd_path(fd).encode(), str(target).encode(), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bind volume onto {target}: {os.strerror(err)}")


def owner_bind(fd: int, target: Path, uid_base: int, v: VolumeSpec) -> None:
    """Bind directory ``fd`` on ``target``, idmapped for a sandbox whose root is host
    ``uid_base``: the directory's owner (and group) on disk is the sandbox's root, other ids
    1-65535 are the sandbox's same ids, on-disk root is nobody inside unless it owns the
    directory (``idmap.owner_mapping``; docs/volumes.md "File ownership")."""
    st = os.fstat(fd)
    ns_fd = idmap.userns_fd_mapped(
        idmap.owner_mapping(uid_base, st.st_uid, uidrange.RANGE_SIZE),
        idmap.owner_mapping(uid_base, st.st_gid, uidrange.RANGE_SIZE))
    try:
        idmap.idmapped_bind_fd(fd, target, ns_fd, read_only=v.read_only)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP):
            raise
        raise _bad("INVALID_HOST_PATH" if v.kind == "host" else "UNSUPPORTED_BACKEND",
                   f"volume {v.name!r}: its file system cannot be idmapped into the "
                   f"sandbox's user namespace ({exc.strerror}); use a directory on ext4, "
                   "xfs, btrfs or tmpfs, or turn [runtime] user_namespaces off") from exc
    finally:
        os.close(ns_fd)


def stage(volumes: list[VolumeSpec], sandbox_root: Path, container_id: str,
          pvcs: PvcStore, allowed_host_paths: list[str],
          uid_base: int | None = None) -> list[StagedVolume]:
    """Open every source safely and bind it below ``sandbox_root/volumes``.

    ``uid_base``: the sandbox runs in a user namespace from that host uid on; each bind is
    then idmapped (``owner_bind``) so that the sandbox's root acts in the volume as the
    owner of the bound directory. On failure what was staged stays for the caller's
    teardown (it unmounts everything below the sandbox folder and calls ``pvcs.release``).
    """
    staged: list[StagedVolume] = []
    vol_dir = sandbox_root / "volumes"
    # First: its existence tells the teardown that this sandbox may hold pvc claims.
    vol_dir.mkdir(mode=0o700, exist_ok=True)
    for v in volumes:
        sub = (v.sub_path or "").strip("/")
        if v.kind == "host":
            root, rel = host_root(v.source, allowed_host_paths, pvcs.root.parent)
            rel = os.path.join(rel, sub) if sub else rel
        elif v.kind == "pvc":
            root = str(pvcs.acquire(
                v.source, container_id,
                create=bool(v.options.get("createIfNotExists", True)),
                delete_when_unused=bool(v.options.get("deleteOnSandboxTermination", False)),
                volume_name=v.name, size=pvc_size(v)))
            rel = sub
        else:
            raise _bad("UNSUPPORTED_BACKEND", f"volume {v.name!r}: {v.kind} volumes are not "
                                              "supported by the oci runtime")
        fd = open_source(v, root, rel)
        try:
            target = vol_dir / v.name
            target.mkdir(mode=0o700)
            if uid_base is None:
                bind_fd(fd, target)
            else:
                owner_bind(fd, target, uid_base, v)
        finally:
            os.close(fd)
        staged.append(StagedVolume(v, target))
    return staged


def oci_mounts(staged: list[StagedVolume]) -> list[dict[str, Any]]:
    """config.json entries binding each staged volume at its mount path.

    nosuid and nodev: a volume is data shared with the host or other sandboxes, never a way
    to bring in set-uid programs or device nodes. Shallower mount paths first, so that a
    volume inside another one's mount path is mounted on top of it, whatever the request's
    order (as Docker does).
    """
    ordered = sorted(staged, key=lambda s: len(Path(s.spec.mount_path).parts))
    return [
        {"destination": s.spec.mount_path, "type": "bind", "source": str(s.staged),
         "options": ["bind", "ro" if s.spec.read_only else "rw", "nosuid", "nodev"]}
        for s in ordered
    ]


def unstage(sandbox_root: Path, container_id: str, pvcs: PvcStore) -> None:
    """Unmount the staged volumes, remove their mount points, release the pvc claims.

    Raises if one stays mounted: removing the sandbox folder then would delete the volume's
    contents. Sandboxes without volumes cost one ``stat``.
    """
    vol_dir = sandbox_root / "volumes"
    if not vol_dir.is_dir():
        return
    for mp in mounts.mounts_under(vol_dir):
        mounts.unmount(Path(mp))
    left = mounts.mounts_under(vol_dir)
    if left:
        raise OSError(f"volumes still mounted below {vol_dir}: {left}")
    for d in vol_dir.iterdir():
        d.rmdir()  # empty mount points only: never deletes a volume's files
    pvcs.release(container_id)  # before the folder goes: a crash here is retried
    vol_dir.rmdir()
