"""A create request's ``volumes[]`` checked before the sandbox is accepted (400/501 at once).

The rules and error codes are the reference server's (``VOLUME::*``), so clients see the same
answers: DNS-label names, unique; absolute mount paths; relative ``subPath`` without ``..``;
host paths absolute, normalised and under ``[storage] allowed_host_paths`` (an empty list
refuses every host volume) - lexically *and* after resolving symlinks, so a link inside an
allowed directory cannot lead out of it. The runtime checks again when it mounts (it opens
the path without following links), so a link swapped in afterwards does not get through.
"""

from __future__ import annotations

import os
import re
from typing import Any

from sandlot.errors import InvalidRequest, Unsupported
from sandlot.server import spec_parts
from sandlot.server.quantity import parse_pvc_storage

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Paths sandlot itself mounts in every sandbox: a volume there would hide or replace them.
RESERVED_MOUNT_PATHS = ("/", "/proc", "/sys", "/dev", "/opt/sandlot", "/run/sandlot",
                        "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")


def _bad(code: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, code=f"VOLUME::{code}")


# Why a runtime cannot cap a pvc volume's size (``capabilities.pvc_size`` false).
PVC_SIZE_WHY = {
    "docker": (": its volumes are the engine's local-driver named volumes, which take a size "
               "only as a tmpfs (memory, lost with the volume's last container) or on an "
               "XFS data root with project quotas"),
}

OSSFS_WHY = ("sandlot mounts no object-storage file systems (no ossfs client, and it would "
             "hold cloud credentials on the host); use a host or pvc volume")


def check_volumes(
    volumes: list[dict[str, Any]] | None,
    allowed_host_paths: list[str],
    supported_kinds: frozenset[str] = frozenset({"host", "pvc"}),
    runtime_name: str = "oci",
    data_dir: str | None = None,
    pvc_size: bool = False,
) -> None:
    """Raise ``InvalidRequest``/``Unsupported`` for the first volume that cannot be served.

    ``supported_kinds`` are the runtime's ``capabilities.volume_kinds``: another kind is 501;
    so is a pvc ``storage`` size unless the runtime enforces one (``capabilities.pvc_size``).
    """
    seen: set[str] = set()
    mount_paths: set[str] = set()
    for v in volumes or []:
        name = v.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("INVALID_NAME", "volume name cannot be empty")
        if len(name) > 63 or not DNS_LABEL.match(name):
            raise _bad("INVALID_NAME", f"volume name {name!r} is not a DNS label "
                                       "(lowercase letters, digits and '-', at most 63)")
        if name in seen:
            raise _bad("DUPLICATE_NAME", f"duplicate volume name {name!r}")
        seen.add(name)
        mount_path = check_mount_path(name, v.get("mountPath"))
        if mount_path in mount_paths:
            raise _bad("INVALID_MOUNT_PATH", f"volume {name!r}: another volume is already "
                                             f"mounted at {mount_path!r}")
        mount_paths.add(mount_path)
        check_sub_path(name, v.get("subPath"))
        try:
            kind = spec_parts.volume_kind(v)
        except InvalidRequest as exc:
            raise _bad("INVALID_BACKEND", exc.message) from exc
        if kind not in supported_kinds:
            offered = ", ".join(sorted(supported_kinds)) or "none"
            why = f": {OSSFS_WHY}" if kind == "ossfs" else ""
            raise Unsupported(
                f"volume {name!r}: {kind} volumes are not supported by the {runtime_name} "
                f"runtime (volume kinds it supports: {offered}){why}",
                code="VOLUME::UNSUPPORTED_BACKEND",
            )
        backend = v[kind] if isinstance(v[kind], dict) else {}
        if kind == "host":
            check_host_path(name, backend.get("path"), v.get("subPath"), allowed_host_paths,
                            data_dir)
        elif kind == "pvc":
            check_pvc(name, backend, pvc_size, runtime_name)


def check_mount_path(name: str, mount_path: Any) -> str:
    if not isinstance(mount_path, str) or not mount_path.startswith("/"):
        raise _bad("INVALID_MOUNT_PATH", f"volume {name!r}: mountPath {mount_path!r} must be "
                                         "an absolute path starting with '/'")
    norm = os.path.normpath(mount_path)
    if ".." in mount_path.split("/") or "\0" in mount_path:
        raise _bad("INVALID_MOUNT_PATH", f"volume {name!r}: mountPath {mount_path!r} may not "
                                         "contain '..'")
    for reserved in RESERVED_MOUNT_PATHS:
        if norm == reserved or (reserved not in ("/",) and norm.startswith(reserved + "/")):
            raise _bad("INVALID_MOUNT_PATH", f"volume {name!r}: mountPath {mount_path!r} is "
                                             "used by the sandbox itself")
    return norm


def check_sub_path(name: str, sub_path: Any) -> None:
    if sub_path is None or sub_path == "":
        return
    if not isinstance(sub_path, str) or sub_path.startswith("/") or "\0" in sub_path:
        raise _bad("INVALID_SUB_PATH", f"volume {name!r}: subPath {sub_path!r} must be a "
                                       "relative path")
    if ".." in sub_path.split("/"):
        raise _bad("INVALID_SUB_PATH", f"volume {name!r}: subPath {sub_path!r} contains '..'")


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def check_host_path(
    name: str, path: Any, sub_path: str | None, allowed_host_paths: list[str],
    data_dir: str | None = None,
) -> str:
    """The host directory to bind (path + subPath), checked against the allow-list.

    Never the server's data dir, nor anything in it or above it (its secret, the database and
    every sandbox's files), whatever the allow-list says.
    """
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise _bad("INVALID_HOST_PATH", f"volume {name!r}: host path {path!r} must be an "
                                        "absolute path")
    if ".." in path.split("/"):
        raise _bad("INVALID_HOST_PATH", f"volume {name!r}: host path {path!r} contains '..'")
    if "//" in path or (len(path) > 1 and path.endswith("/")) or "/./" in path + "/":
        raise _bad("INVALID_HOST_PATH", f"volume {name!r}: host path {path!r} is not "
                                        "normalised (remove redundant '/' and '.')")
    full = os.path.join(path, sub_path) if sub_path else path
    if not allowed_host_paths:
        raise _bad("HOST_PATH_NOT_ALLOWED",
                   f"volume {name!r}: host path {path!r} is not allowed: this server allows "
                   "no host volumes ([storage] allowed_host_paths is empty)")
    if not any(_under(full, p) for p in allowed_host_paths):
        raise _bad("HOST_PATH_NOT_ALLOWED",
                   f"volume {name!r}: host path {full!r} is not under an allowed prefix "
                   f"({', '.join(allowed_host_paths)})")
    resolved = os.path.realpath(full)
    if not any(_under(resolved, os.path.realpath(p)) for p in allowed_host_paths):
        raise _bad("HOST_PATH_NOT_ALLOWED",
                   f"volume {name!r}: host path {full!r} resolves to {resolved!r} (through a "
                   "symbolic link), which is not under an allowed prefix")
    if data_dir is not None:
        real_data = os.path.realpath(data_dir)
        if _under(resolved, real_data) or _under(real_data, resolved):
            raise _bad("HOST_PATH_NOT_ALLOWED",
                       f"volume {name!r}: host path {full!r} holds or is inside the server's "
                       "data dir (sandbox files and secrets), which is never bound")
    return full


def check_pvc(name: str, backend: dict[str, Any], pvc_size: bool = False,
              runtime_name: str = "oci") -> None:
    claim = backend.get("claimName")
    if not isinstance(claim, str) or not claim:
        raise _bad("INVALID_PVC_NAME", f"volume {name!r}: pvc claimName cannot be empty")
    if len(claim) > 253 or not DNS_LABEL.match(claim):
        raise _bad("INVALID_PVC_NAME", f"volume {name!r}: pvc claimName {claim!r} is not a "
                                       "DNS label (lowercase letters, digits and '-')")
    if backend.get("storage") in (None, ""):
        return
    if not pvc_size:
        raise Unsupported(
            f"volume {name!r}: pvc storage size {backend['storage']!r} cannot be enforced by "
            f"the {runtime_name} runtime{PVC_SIZE_WHY.get(runtime_name, '')}; leave storage "
            "out for a volume without a size limit",
            code="VOLUME::UNSUPPORTED_BACKEND",
        )
    parse_pvc_storage(name, str(backend["storage"]))
