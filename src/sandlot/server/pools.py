"""PoolService: named pools of pre-started sandboxes (``/v1/pools``, ``extensions.poolRef``).

A pool names an image and a resource shape and keeps ``capacitySpec.bufferMax`` sandboxes of
it pre-started (the runtime's warm pool, one per named pool). A create naming the pool takes
one (the shape applied at claim), or starts cold when none is ready, with the same result; the
pool then refills. Pools are stored, so they are kept again after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sandlot.errors import Conflict, InvalidRequest, NotFound, Unsupported
from sandlot.runtime.base import ImageRef, Runtime
from sandlot.server import codes
from sandlot.server.models import utcnow
from sandlot.server.pool_models import PoolRecord, check_template
from sandlot.server.quantity import parse_cpu, parse_memory
from sandlot.server.store.pools import PoolStore

log = logging.getLogger(__name__)
POOL_REF = "poolRef"


def _not_found(name: str) -> NotFound:
    return NotFound(f"pool {name} not found", code=codes.POOL_NOT_FOUND)


def check_capacity(capacity: dict[str, Any]) -> dict[str, int]:
    keys = ("bufferMax", "bufferMin", "poolMax", "poolMin")
    missing = [k for k in keys if k not in capacity]
    if missing:
        raise InvalidRequest(f"capacitySpec needs {', '.join(missing)}")
    out = {}
    for k in keys:
        v = capacity[k]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidRequest(f"capacitySpec.{k} must be a whole number >= 0")
        out[k] = v
    if out["bufferMin"] > out["bufferMax"] or out["poolMin"] > out["poolMax"]:
        raise InvalidRequest("capacitySpec: a minimum exceeds its maximum")
    return out


class PoolService:
    def __init__(self, runtime: Runtime, store: PoolStore,
                 allocated: Callable[[str], int]) -> None:
        self.runtime = runtime
        self.store = store
        self._allocated = allocated  # live sandboxes created naming the pool
        self._records: dict[str, PoolRecord] = {}
        # (kind, id) -> snapshot id of a Ready snapshot / Succeeded template (set by the app).
        self.snapshot_of: Callable[[str, str], str] | None = None

    def require_support(self) -> None:
        if not self.runtime.capabilities.pools:
            raise Unsupported(f"pools are not supported by the {self.runtime.name} runtime",
                              code=codes.POOL_NOT_SUPPORTED)

    async def start(self) -> None:
        for rec in await self.store.load_all():
            self._records[rec.name] = rec
            if self.runtime.capabilities.pools:
                try:
                    await self._keep(rec)
                except Exception:  # noqa: BLE001 - the pool stays defined; creates start cold
                    log.warning("cannot keep pool %s", rec.name, exc_info=True)

    async def _keep(self, rec: PoolRecord) -> None:
        room = rec.capacity["poolMax"] - self._allocated(rec.name)
        snapshot_id = self.source_snapshot(rec)
        await self.runtime.ensure_pool(rec.name, ImageRef(rec.image),
                                       max(0, min(rec.size, room)), snapshot_id=snapshot_id,
                                       limits=rec.resource_limits)

    def source_snapshot(self, rec: PoolRecord) -> str | None:
        """The snapshot a pool's sandboxes start on (image ``snapshot:<id>`` or
        ``template:<id>``), None for a plain image."""
        kind, sep, ref = rec.image.partition(":")
        if sep and kind == "snapshot" and self.snapshot_of is not None:
            return self.snapshot_of("snapshot", ref)
        if sep and kind == "template" and self.snapshot_of is not None:
            return self.snapshot_of("template", ref)
        return None

    def get(self, name: str) -> PoolRecord:
        self.require_support()
        rec = self._records.get(name)
        if rec is None:
            raise _not_found(name)
        return rec

    def list(self) -> list[PoolRecord]:
        self.require_support()
        return sorted(self._records.values(), key=lambda r: r.name)

    def status(self, rec: PoolRecord) -> dict[str, Any]:
        allocated = self._allocated(rec.name)
        available = self.runtime.pool_ready(rec.name)
        return {"total": allocated + available, "allocated": allocated,
                "available": available, "revision": str(rec.revision)}

    async def create(self, name: str, template: dict[str, Any],
                     capacity: dict[str, Any]) -> PoolRecord:
        self.require_support()
        check_template(template)
        cap = check_capacity(capacity)
        if name in self._records:
            raise Conflict(f"pool {name} already exists", code=codes.POOL_ALREADY_EXISTS)
        rec = PoolRecord(name=name, template=template, capacity=cap, revision=1,
                         created_at=utcnow())
        for key, value in rec.resource_limits.items():  # 400 now, not at every create
            (parse_cpu if key == "cpu" else parse_memory)(value)
        await self._keep(rec)  # resolves (pulls) the image: an unknown one fails here
        self._records[name] = rec
        await self.store.save(rec)
        return rec

    async def update(self, name: str, capacity: dict[str, Any]) -> PoolRecord:
        rec = self.get(name)
        rec.capacity = check_capacity(capacity)
        rec.revision += 1
        await self._keep(rec)
        await self.store.save(rec)
        return rec

    async def delete(self, name: str) -> None:
        self.get(name)
        await self.runtime.remove_pool(name)
        self._records.pop(name, None)
        await self.store.delete(name)

    async def refill(self, name: str) -> None:
        """Re-size after a sandbox of the pool came or went (``poolMax`` bounds the total)."""
        rec = self._records.get(name)
        if rec is not None and self.runtime.capabilities.pools:
            await self._keep(rec)
