"""SnapshotService: snapshot lifecycle (Creating -> Ready | Failed) over the runtime.

A create is accepted at once (202, ``Creating``); the runtime's capture runs in a background
task. Records are stored, so snapshots survive a restart; one left ``Creating`` or ``Deleting``
by a crash is settled at start (Failed). Deleting a snapshot that a live sandbox
(or a later snapshot) still stands on is refused with 409 ``SNAPSHOT::DELETE_CONFLICT``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from sandlot.errors import Conflict, NotFound, SandlotError, Unsupported
from sandlot.runtime.base import Runtime
from sandlot.server import codes
from sandlot.server.models import SandboxState, utcnow
from sandlot.server.snapshot_models import SnapshotRecord, SnapshotState
from sandlot.server.store.snapshots import SnapshotStore
from sandlot.server.tenancy.principal import visible

log = logging.getLogger(__name__)


@dataclass
class SnapshotPage:
    items: list[SnapshotRecord]
    page: int
    page_size: int
    total_items: int

    @property
    def total_pages(self) -> int:
        return (self.total_items + self.page_size - 1) // self.page_size


def _not_found(snapshot_id: str) -> NotFound:
    return NotFound(f"snapshot {snapshot_id} not found", code="SNAPSHOT::NOT_FOUND")


class SnapshotService:
    def __init__(self, runtime: Runtime, store: SnapshotStore) -> None:
        self.runtime = runtime
        self.store = store
        self._records: dict[str, SnapshotRecord] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def require_support(self) -> None:
        if not self.runtime.capabilities.snapshots:
            raise Unsupported(f"snapshots are not supported by the {self.runtime.name} runtime "
                              "(it has no snapshot store)", code=codes.SNAPSHOT_NOT_IMPLEMENTED)

    async def start(self) -> None:
        for rec in await self.store.load_all():
            self._records[rec.id] = rec
        for rec in list(self._records.values()):
            if rec.state == SnapshotState.CREATING:  # its capture died with the last server
                # What the capture left (a complete layer, when it died after the copy) goes:
                # a Failed snapshot holds nothing.
                try:
                    await self.runtime.delete_snapshot(rec.id)
                except Exception:  # noqa: BLE001 - the record still says Failed; delete retries
                    log.warning("removing the layer of interrupted snapshot %s failed", rec.id,
                                exc_info=True)
                rec.transition(SnapshotState.FAILED, "snapshot_interrupted",
                               "the server stopped while the snapshot was being captured")
                await self.store.save(rec)

    async def stop(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)  # a capture is short: finish it

    # ----- queries ---------------------------------------------------------------------

    def get(self, snapshot_id: str) -> SnapshotRecord:
        self.require_support()
        rec = self._records.get(snapshot_id)
        if rec is None or not visible(rec.owner):  # another tenant's: as if unknown
            raise _not_found(snapshot_id)
        return rec

    def ready(self, snapshot_id: str) -> SnapshotRecord:
        """The snapshot to create a sandbox from: 404 when unknown, 409 unless Ready."""
        self.require_support()
        rec = self.get(snapshot_id)
        if rec.state != SnapshotState.READY:
            raise Conflict(f"snapshot {snapshot_id} is {rec.state.value}, not Ready",
                           code="SNAPSHOT::NOT_READY")
        return rec

    def search(self, sandbox_id: str | None, name: str | None, states: list[str] | None,
             page: int, page_size: int) -> SnapshotPage:
        self.require_support()
        wanted = {s.lower() for s in states} if states else None
        items = [r for r in self._records.values()
                 if visible(r.owner)
                 and (sandbox_id is None or r.sandbox_id == sandbox_id)
                 and (name is None or r.name == name)
                 and (wanted is None or r.state.value.lower() in wanted)]
        items.sort(key=lambda r: (r.created_at, r.id))
        start = (page - 1) * page_size
        return SnapshotPage(items[start:start + page_size], page, page_size, len(items))

    # ----- create / delete -------------------------------------------------------------

    async def create(self, sandbox_id: str, state: SandboxState, image_uri: str,
                     entrypoint: list[str], name: str | None,
                     owner: str | None = None) -> SnapshotRecord:
        """Accept a snapshot of a sandbox the caller found in ``state``; captured after.
        ``owner``: the sandbox's tenant, who owns the snapshot whoever asked for it."""
        self.require_support()
        if state != SandboxState.RUNNING:
            raise Conflict(f"sandbox {sandbox_id} is {state.value}; only a Running sandbox "
                           "can be snapshotted", code=codes.SNAPSHOT_INVALID_SOURCE_STATE)
        now = utcnow()
        rec = SnapshotRecord(
            id=str(uuid.uuid4()), sandbox_id=sandbox_id, name=name,
            state=SnapshotState.CREATING, reason="snapshot_accepted",
            message="snapshot creation accepted", image_uri=image_uri,
            entrypoint=list(entrypoint), created_at=now, last_transition_at=now, owner=owner,
        )
        self._records[rec.id] = rec
        await self.store.save(rec)
        task = asyncio.create_task(self._capture(rec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rec

    async def _capture(self, rec: SnapshotRecord) -> None:
        try:
            await self.runtime.snapshot(rec.sandbox_id, rec.id)
        except Exception as exc:  # noqa: BLE001 - recorded as the snapshot's failure
            message = exc.message if isinstance(exc, SandlotError) else f"{exc}"
            log.warning("snapshot %s of %s failed: %s", rec.id, rec.sandbox_id, message)
            rec.transition(SnapshotState.FAILED, "snapshot_capture_failed", message)
        else:
            rec.transition(SnapshotState.READY, "snapshot_ready", "snapshot is ready")
        if rec.id in self._records:
            await self.store.save(rec)

    async def delete(self, snapshot_id: str) -> None:
        self.require_support()
        rec = self.get(snapshot_id)
        if rec.state == SnapshotState.CREATING:
            raise Conflict(f"snapshot {snapshot_id} is still being created and cannot be "
                           "deleted", code="SNAPSHOT::INVALID_STATE")
        await self.runtime.delete_snapshot(snapshot_id)  # Conflict (409) while in use
        await self.store.delete(rec.id)
        self._records.pop(rec.id, None)
