"""The bounds every create is held to, whoever sends it (SDK, raw API, osb, MCP).

- resources: ``[runtime] default_resources`` fill in what a request omits, and
  ``[runtime] max_resources`` (by default the host's CPUs, memory, the runtime's pids cap
  and the data dir's disk for ``ephemeral-storage``) refuse what is larger, with a 400
  naming the field;
- the number of live sandboxes a server holds (``[runtime] max_sandboxes``);
- the timeout range (a value ``timedelta`` cannot hold is a 400, not a 500);
- endpoints: ports in 1-65535, a bounded number of host listeners per sandbox;
- metadata keys under the reserved ``opensandbox.io/`` prefix, refused on create as on patch
  (what the reference server does).

Kept apart from the lifecycle rules in ``service.py``: one function per bound, called there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from sandlot.config import Config
from sandlot.errors import InvalidRequest, SandlotError
from sandlot.server.quantity import (
    parse_cpu,
    parse_ephemeral_storage,
    parse_memory,
    parse_quantity,
)

RESERVED_METADATA_PREFIX = "opensandbox.io/"
# Longest sandbox timeout when the server sets no maximum: 10 years (a datetime that far
# out is still representable everywhere; 10^20 seconds is not).
TIMEOUT_CEILING_SECONDS = 10 * 365 * 24 * 3600
# resourceLimits keys the runtime enforces (the disk cap, ``DISK_KEY``, where it can).
ENFORCED_KEYS = ("cpu", "memory", "pids")
DISK_KEY = "ephemeral-storage"


class LimitReached(SandlotError):
    status = 429
    code = "SANDBOX_LIMIT_REACHED"


@dataclass(frozen=True)
class Resources:
    cpu: float | None
    memory: int | None
    pids: int


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _max_disk(configured: str | None, data_dir: Path) -> int | None:
    """The largest disk cap: the configured one, else the size of the data dir's file system
    (the sparse image holding a sandbox's writes lives there; a bigger cap caps nothing)."""
    if configured:
        return parse_ephemeral_storage(configured)
    try:
        st = os.statvfs(data_dir)
    except OSError:
        return None  # not made yet (tests, a first start): the runtime's checks apply
    return st.f_blocks * st.f_frsize


def _parse_pids(value: str) -> int:
    pids = parse_quantity(value, "pids")
    if pids != pids.to_integral_value() or pids < 1:
        raise InvalidRequest(f"resourceLimits.pids must be a whole number >= 1, got {value!r}")
    return int(pids)


class CreateBounds:
    """Parsed once from the config; ``resources()`` and ``check_*`` apply them per create."""

    def __init__(self, cfg: Config) -> None:
        rt = cfg.runtime
        self.max_sandboxes = rt.max_sandboxes
        self.max_endpoints = cfg.server.max_endpoints_per_sandbox
        self.max_timeout = min(cfg.server.max_sandbox_timeout_seconds or TIMEOUT_CEILING_SECONDS,
                               TIMEOUT_CEILING_SECONDS)
        for section, values in (("default_resources", rt.default_resources),
                                ("max_resources", rt.max_resources)):
            for key in values:
                if key not in (*ENFORCED_KEYS, DISK_KEY):
                    known = ", ".join((*ENFORCED_KEYS, DISK_KEY))
                    raise ValueError(f"[runtime] {section}: {key!r} is not supported (known "
                                     f"keys: {known})")
        mx = rt.max_resources
        self.max_cpu = parse_cpu(mx["cpu"]) if "cpu" in mx else float(os.cpu_count() or 1)
        self.max_memory = parse_memory(mx["memory"]) if "memory" in mx else _host_memory()
        self.max_pids = min(_parse_pids(mx["pids"]), rt.pids_limit) if "pids" in mx \
            else rt.pids_limit
        self.max_disk = _max_disk(mx.get(DISK_KEY), cfg.data_dir)
        self.defaults = dict(rt.default_resources)
        old_key = rt.default_ephemeral_storage
        if DISK_KEY in self.defaults and old_key and old_key != self.defaults[DISK_KEY]:
            raise ValueError(f"[runtime] default_resources: {DISK_KEY!r} "
                             f"{self.defaults[DISK_KEY]!r} contradicts default_ephemeral_storage "
                             f"{old_key!r}: set one of them")
        self.default_disk = self.defaults.get(DISK_KEY) or old_key
        try:
            self.resources({})  # the defaults themselves must be within the maxima
            self.disk({})
        except InvalidRequest as exc:
            raise ValueError(f"[runtime] default_resources: {exc.message}") from exc

    def disk(self, limits: dict[str, str]) -> int | None:
        """The writable layer's cap in bytes: the request's, else the default (None: no cap);
        never above ``max_resources["ephemeral-storage"]`` or the data dir's disk."""
        asked = limits.get(DISK_KEY) or self.default_disk
        if not asked:
            return None
        size = parse_ephemeral_storage(asked)
        if self.max_disk is not None and size > self.max_disk:
            raise InvalidRequest(
                f"resourceLimits.{DISK_KEY} {asked!r} exceeds this server's maximum of "
                f"{self.max_disk} bytes ([runtime] max_resources, at most the data dir's disk)"
            )
        return size

    def resources(self, requested: dict[str, str]) -> Resources:
        """The limits a sandbox gets: the request's, else the defaults; never above the max."""
        merged = {**self.defaults, **{k: v for k, v in requested.items() if v not in ("", None)}}
        cpu = parse_cpu(merged["cpu"]) if "cpu" in merged else None
        memory = parse_memory(merged["memory"]) if "memory" in merged else None
        pids = _parse_pids(merged["pids"]) if "pids" in merged else self.max_pids
        if cpu is not None and Decimal(str(cpu)) > Decimal(str(self.max_cpu)):
            raise InvalidRequest(
                f"resourceLimits.cpu {merged['cpu']!r} exceeds this server's maximum of "
                f"{self.max_cpu:g} cores ([runtime] max_resources)"
            )
        if memory is not None and memory > self.max_memory:
            raise InvalidRequest(
                f"resourceLimits.memory {merged['memory']!r} exceeds this server's maximum of "
                f"{self.max_memory} bytes ([runtime] max_resources)"
            )
        if pids > self.max_pids:
            raise InvalidRequest(
                f"resourceLimits.pids {merged['pids']!r} exceeds this server's maximum of "
                f"{self.max_pids} ([runtime] max_resources / pids_limit)"
            )
        return Resources(cpu, memory, pids)

    def check_capacity(self, live: int) -> None:
        if self.max_sandboxes and live >= self.max_sandboxes:
            raise LimitReached(
                f"this server already holds {live} sandboxes, its maximum "
                f"([runtime] max_sandboxes = {self.max_sandboxes}); delete one first"
            )

    def check_listeners(self, open_now: int) -> None:
        """Each endpoint is a host listener: a sandbox may not open them without bound."""
        if open_now >= self.max_endpoints:
            raise LimitReached(
                f"this sandbox already has {open_now} endpoints open, the maximum "
                f"([server] max_endpoints_per_sandbox)",
                code="ENDPOINT_LIMIT_REACHED",
            )

    def check_timeout(self, timeout: int | None) -> None:
        if timeout is not None and timeout > self.max_timeout:
            raise InvalidRequest(
                f"timeout {timeout}s is out of range: at most {self.max_timeout}s"
            )


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise InvalidRequest(f"port {port} is out of range: use 1-65535")


def check_metadata_keys(metadata: dict[str, str]) -> None:
    for key in metadata:
        if key.startswith(RESERVED_METADATA_PREFIX):
            raise InvalidRequest(
                f"metadata key {key!r} uses the reserved {RESERVED_METADATA_PREFIX} prefix "
                "(keys under it are managed by the server)",
                code="INVALID_METADATA_LABEL",
            )
