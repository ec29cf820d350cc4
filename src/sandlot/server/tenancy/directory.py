"""The tenants file (the reference server's ``tenants.toml``), read into a key -> principal map.

Format (``[[tenants]]`` as in the reference's OSEP-0012; ``quota`` and ``[admin]`` are
sandlot's)::

    [admin]                      # optional: admin keys, rotatable without a restart
    api_keys = ["sha256:..."]

    [[tenants]]
    name = "team-a"
    namespace = "ns-a"           # optional here (Kubernetes only in the reference)
    api_keys = ["<key>", "sha256:<hex>"]
    quota = { sandboxes = 10, cpu = "8", memory = "16Gi" }

Where it is: ``[tenants] file`` in sandlot's config, else ``SANDBOX_TENANTS_CONFIG_PATH``,
else ``~/.opensandbox/tenants.toml`` when that exists (the reference's order). The file is
re-read when it changes (checked on each authenticated request: one ``stat``) and on SIGHUP.
A file that fails to parse on reload keeps the previous tenants (logged); a deleted file
drops them all (their keys answer 401), as on the reference.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.errors import SandlotError
from sandlot.server.quantity import parse_cpu, parse_memory
from sandlot.server.tenancy.keys import is_weak_plaintext, stored_digest
from sandlot.server.tenancy.principal import Principal, Quota

log = logging.getLogger(__name__)
PATH_ENV = "SANDBOX_TENANTS_CONFIG_PATH"
DEFAULT_PATH = Path("~/.opensandbox/tenants.toml")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")
_TENANT_KEYS = {"name", "namespace", "api_keys", "quota"}
_QUOTA_KEYS = {"sandboxes", "cpu", "memory"}


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message names the file and the entry."""


def tenants_path(configured: str | None) -> Path | None:
    """The tenants file to use, or None (single-tenant: only ``[server] api_key``)."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(PATH_ENV):
        return Path(os.environ[PATH_ENV]).expanduser()
    default = DEFAULT_PATH.expanduser()
    return default if default.is_file() else None


@dataclass(frozen=True)
class Tenants:
    """One parsed version of the file."""

    by_digest: dict[str, Principal]
    names: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def _quota(name: str, raw: Any) -> Quota:
    if raw is None:
        return Quota()
    if not isinstance(raw, dict):
        raise TenantsFileError(f"tenant {name!r}: quota must be a table")
    unknown = set(raw) - _QUOTA_KEYS
    if unknown:
        raise TenantsFileError(f"tenant {name!r}: unknown quota keys {sorted(unknown)} "
                               f"(known: {', '.join(sorted(_QUOTA_KEYS))})")
    sandboxes = raw.get("sandboxes")
    if sandboxes is not None and (not isinstance(sandboxes, int) or isinstance(sandboxes, bool)
                                  or sandboxes < 0):
        raise TenantsFileError(f"tenant {name!r}: quota.sandboxes must be a whole number >= 0")
    try:
        cpu = parse_cpu(str(raw["cpu"])) if "cpu" in raw else None
        memory = parse_memory(str(raw["memory"])) if "memory" in raw else None
    except SandlotError as exc:
        raise TenantsFileError(f"tenant {name!r}: quota: {exc.message}") from None
    return Quota(sandboxes=sandboxes, cpu=cpu, memory=memory)


def _digests(owner: str, raw: Any, warnings: list[str]) -> list[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(k, str) for k in raw):
        raise TenantsFileError(f"{owner}: api_keys must be a non-empty list of strings")
    out = []
    for entry in raw:
        try:
            out.append(stored_digest(entry))
        except ValueError as exc:
            raise TenantsFileError(f"{owner}: {exc}") from None
        if is_weak_plaintext(entry):
            warnings.append(f"{owner}: an API key shorter than 16 characters is easy to guess")
    return out


def parse(data: dict[str, Any], origin: str = "tenants file") -> Tenants:
    """Validate a parsed tenants file; every problem is a ``TenantsFileError``."""
    unknown = set(data) - {"tenants", "admin"}
    if unknown:
        raise TenantsFileError(f"{origin}: unknown top-level keys {sorted(unknown)} "
                               "(known: [[tenants]], [admin])")
    warnings: list[str] = []
    by_digest: dict[str, Principal] = {}

    def add(digest: str, principal: Principal) -> None:
        if digest in by_digest:
            raise TenantsFileError(f"{origin}: one API key is given to both "
                                   f"{by_digest[digest].name!r} and {principal.name!r}")
        by_digest[digest] = principal

    admin = data.get("admin")
    if admin is not None:
        if not isinstance(admin, dict) or set(admin) - {"api_keys"}:
            raise TenantsFileError(f"{origin}: [admin] takes api_keys only")
        admin_principal = Principal("admin", admin=True)
        for d in _digests("[admin]", admin.get("api_keys"), warnings):
            add(d, admin_principal)
    entries = data.get("tenants", [])
    if not isinstance(entries, list):
        raise TenantsFileError(f"{origin}: tenants must be an array of tables ([[tenants]])")
    names: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TenantsFileError(f"{origin}: tenants[{i}] is not a table")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise TenantsFileError(f"{origin}: tenants[{i}].name must be 1-128 letters, "
                                   "digits, '.', '_' or '-'")
        extra = set(entry) - _TENANT_KEYS
        if extra:
            raise TenantsFileError(f"tenant {name!r}: unknown keys {sorted(extra)} "
                                   f"(known: {', '.join(sorted(_TENANT_KEYS))})")
        if name in names:
            raise TenantsFileError(f"{origin}: tenant {name!r} is defined twice")
        names.append(name)
        namespace = entry.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise TenantsFileError(f"tenant {name!r}: namespace must be a string")
        principal = Principal(name, quota=_quota(name, entry.get("quota")), namespace=namespace)
        for d in _digests(f"tenant {name!r}", entry.get("api_keys"), warnings):
            add(d, principal)
    if any(e.get("namespace") for e in entries if isinstance(e, dict)):
        warnings.append("tenant namespaces are kept for display only: sandlot isolates tenants "
                        "by recording each sandbox's owner (it has no Kubernetes runtime)")
    return Tenants(by_digest, tuple(names), tuple(warnings))


def read(path: Path) -> Tenants:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise TenantsFileError(f"{path}: cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TenantsFileError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, str(path))


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()  # follows symlinks: a ConfigMap's swapped link is a new file
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class TenantDirectory:
    """The tenants file's current contents; ``refresh`` re-reads it when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature = _signature(path)
        self.tenants = read(path)  # a bad file at start is fatal (raised to the caller)
        for warning in self.tenants.warnings:
            log.warning("tenants: %s", warning)

    def lookup(self, key_digest: str) -> Principal | None:
        self.refresh()
        return self.tenants.by_digest.get(key_digest)

    def refresh(self, force: bool = False) -> None:
        signature = _signature(self.path)
        if signature == self._signature and not force:
            return
        self._signature = signature
        if signature is None:
            log.warning("tenants: %s was removed; tenant keys no longer authenticate",
                        self.path)
            self.tenants = Tenants({}, ())
            return
        try:
            self.tenants = read(self.path)
        except TenantsFileError as exc:
            log.error("tenants: keeping the previous tenants, the new file is refused: %s", exc)
            return
        for warning in self.tenants.warnings:
            log.warning("tenants: %s", warning)
        log.info("tenants: reloaded %s (%d tenants)", self.path, len(self.tenants.names))
