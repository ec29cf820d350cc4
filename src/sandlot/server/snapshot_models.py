"""The control plane's view of a snapshot (``Snapshot`` in sandbox-lifecycle.yml)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from sandlot.server.models import utcnow


class SnapshotState(enum.StrEnum):
    CREATING = "Creating"
    READY = "Ready"
    FAILED = "Failed"
    DELETING = "Deleting"


@dataclass
class SnapshotRecord:
    id: str
    sandbox_id: str  # the source sandbox (it may be gone since)
    name: str | None
    state: SnapshotState
    image_uri: str  # what sandboxes created from it report as their image
    entrypoint: list[str]
    created_at: datetime
    last_transition_at: datetime
    reason: str | None = None
    message: str | None = None
    owner: str | None = None  # the source sandbox's tenant (None: the default tenant)

    def transition(self, state: SnapshotState, reason: str, message: str) -> None:
        if state != self.state:
            self.last_transition_at = utcnow()
        self.state = state
        self.reason = reason
        self.message = message
