"""A tenant's quota, checked on create against its live sandboxes (sandboxes, cpu, memory).

A breach is a 429 with ``TENANT_QUOTA_EXCEEDED``, like the server-wide ``max_sandboxes``
(429 ``SANDBOX_LIMIT_REACHED``): the request is well formed, the budget is spent; deleting a
sandbox makes room. Nothing is recorded or started for a refused create.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandlot.errors import SandlotError
from sandlot.server.models import SandboxRecord, SandboxState
from sandlot.server.quantity import parse_cpu, parse_memory
from sandlot.server.tenancy.principal import Principal

_GONE = (SandboxState.TERMINATED, SandboxState.FAILED)


class QuotaExceeded(SandlotError):
    status = 429
    code = "TENANT_QUOTA_EXCEEDED"


def _usage(owner: str, records: Iterable[SandboxRecord]) -> tuple[int, float, int]:
    count, cpu, memory = 0, 0.0, 0
    for rec in records:
        if rec.owner != owner or rec.state in _GONE:
            continue
        count += 1
        limits = rec.resource_limits
        if limits.get("cpu"):
            cpu += parse_cpu(limits["cpu"])
        if limits.get("memory"):
            memory += parse_memory(limits["memory"])
    return count, cpu, memory


def _gib(n: float) -> str:
    return f"{n / (1 << 30):g}Gi"


def check_quota(principal: Principal, records: Iterable[SandboxRecord],
                cpu: float | None, memory: int | None) -> None:
    """Refuse a create of a sandbox with ``cpu`` cores and ``memory`` bytes (None: unbounded)
    that would take ``principal`` over its quota."""
    quota = principal.quota
    if principal.admin or (quota.sandboxes is None and quota.cpu is None
                           and quota.memory is None):
        return
    count, used_cpu, used_memory = _usage(principal.name, records)
    who = f"tenant {principal.name!r}"
    if quota.sandboxes is not None and count + 1 > quota.sandboxes:
        raise QuotaExceeded(f"{who} already has {count} live sandboxes, its quota of "
                            f"{quota.sandboxes}; delete one first")
    if quota.cpu is not None:
        if cpu is None:
            raise QuotaExceeded(f"{who} has a cpu quota: a sandbox needs resourceLimits.cpu")
        if used_cpu + cpu > quota.cpu + 1e-9:
            raise QuotaExceeded(f"{who}: resourceLimits.cpu {cpu:g} on top of the {used_cpu:g} "
                                f"cores its live sandboxes hold exceeds its cpu quota of "
                                f"{quota.cpu:g} cores")
    if quota.memory is not None:
        if memory is None:
            raise QuotaExceeded(f"{who} has a memory quota: a sandbox needs "
                                "resourceLimits.memory")
        if used_memory + memory > quota.memory:
            raise QuotaExceeded(f"{who}: resourceLimits.memory {_gib(memory)} on top of the "
                                f"{_gib(used_memory)} its live sandboxes hold exceeds its "
                                f"memory quota of {_gib(quota.memory)}")
