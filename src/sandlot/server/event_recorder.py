"""EventRecorder: turns lifecycle steps into diagnostic events in the store.

State transitions, image pulls, entrypoint exits, OOM kills, container exits, restarts,
policy changes and expiry each become one line of ``GET .../diagnostics/events``. Recording
never blocks the lifecycle: writes are queued (and committed with the sandbox's own writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandlot.server.models import SandboxState
from sandlot.server.observers import LifecycleObserver
from sandlot.server.store.events import Event, EventStore, FinalLogs

if TYPE_CHECKING:
    from sandlot.runtime.base import ContainerInfo
    from sandlot.server.models import SandboxRecord

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder(LifecycleObserver):
    def __init__(self, store: EventStore,
                 owner_of: Callable[[str], str | None] = lambda _sid: None) -> None:
        self.store = store
        self.owner_of = owner_of  # the sandbox's tenant, stored with each event
        self._pending: set[asyncio.Task[None]] = set()
        self._pulling: set[str] = set()  # sandboxes whose image is being pulled

    def record(self, sandbox_id: str, kind: str, message: str, level: str = NORMAL) -> None:
        """Queue one event (returns at once)."""
        event = Event(sandbox_id, time.time(), level, kind, message, self.owner_of(sandbox_id))
        task = asyncio.get_running_loop().create_task(self._write(event))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def keep_logs(self, sandbox_id: str, logs: FinalLogs) -> None:
        """Queue an ended sandbox's last logs (returns at once: a delete does not wait)."""
        task = asyncio.get_running_loop().create_task(self._write_logs(sandbox_id, logs))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write_logs(self, sandbox_id: str, logs: FinalLogs) -> None:
        try:
            await self.store.save_final_logs(sandbox_id, logs)
        except Exception:  # noqa: BLE001 - lost logs must not fail the delete
            log.warning("keeping the last logs of %s failed", sandbox_id, exc_info=True)

    async def _write(self, event: Event) -> None:
        try:
            await self.store.add(event)
        except Exception:  # noqa: BLE001 - an event lost must not fail the lifecycle
            log.warning("recording event %s of %s failed", event.kind, event.sandbox_id,
                        exc_info=True)

    async def flush(self) -> None:
        """Wait for every event recorded so far to be stored."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        await self.store.flush()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()

    # ----- lifecycle hooks ---------------------------------------------------------------

    def transitioned(self, rec: SandboxRecord, before: SandboxState) -> None:
        failed = rec.state == SandboxState.FAILED
        if rec.state != SandboxState.PENDING:
            self._pulling.discard(rec.id)
        if rec.state == before:  # a new record
            text = f"Sandbox created from {rec.image_uri}"
        else:
            text = f"{before.value} -> {rec.state.value}"
        if rec.reason:
            text += f" ({rec.reason})"
        if rec.message and rec.state != SandboxState.RUNNING:
            text += f": {rec.message}"
        self.record(rec.id, "StateChanged", text, WARNING if failed else NORMAL)

    def step(self, rec: SandboxRecord, step: str, detail: str) -> None:
        if step == "Pulling":
            self._pulling.add(rec.id)
            self.record(rec.id, "Pulling", f"Pulling image {rec.image_uri}")
        elif step == "Starting":
            # The image is there now; a plain start is no event of its own (one write less
            # per create: Pending -> Running says it).
            if rec.id in self._pulling:
                self._pulling.discard(rec.id)
                self.record(rec.id, "Pulled", f"Pulled image {rec.image_uri}")
        else:
            self.record(rec.id, step, detail)

    def policy_changed(self, rec: SandboxRecord) -> None:
        policy = rec.network_policy or {}
        rules = policy.get("egress") or []
        self.record(rec.id, "PolicyChanged",
                    f"Egress policy set: default {policy.get('defaultAction', 'deny')}, "
                    f"{len(rules)} rule(s)")

    def expiring(self, rec: SandboxRecord) -> None:
        when = rec.expires_at.isoformat() if rec.expires_at else "now"
        self.record(rec.id, "Expired", f"Sandbox reached its expiry time ({when}); deleting it")

    def container_ended(self, rec: SandboxRecord, info: ContainerInfo) -> None:
        if info.reason == "OOMKilled":
            self.record(rec.id, "OOMKilled",
                        "The container's init was killed for exceeding its memory limit",
                        WARNING)
        if info.exit_code is not None:
            self.record(rec.id, "ContainerExited",
                        f"Container exited with code {info.exit_code}", WARNING)
        else:
            self.record(rec.id, "ContainerGone",
                        f"Container is no longer running ({info.state.value})", WARNING)

    def recovered(self, rec: SandboxRecord) -> None:
        self.record(rec.id, "Restarted",
                    f"Server restarted; sandbox found {rec.state.value} and taken up again")
