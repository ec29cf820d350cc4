"""The control plane's view of a sandbox: its lifecycle state and what it was created with."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime


class SandboxState(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    PAUSING = "Pausing"
    PAUSED = "Paused"
    RESUMING = "Resuming"
    STOPPING = "Stopping"
    TERMINATED = "Terminated"
    FAILED = "Failed"


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class SandboxRecord:
    """One sandbox as the store keeps it. Secrets (image auth, env) are never persisted.

    ``execd_token`` is None for tokens derived from the server secret (``tokens.py``); only
    sandboxes made by an older sandlot carry their random token here.
    """

    id: str
    state: SandboxState
    image_uri: str
    entrypoint: list[str]
    execd_token: str | None
    created_at: datetime
    last_transition_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    reason: str | None = None
    message: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    resource_limits: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, str] = field(default_factory=dict)
    platform: dict[str, str] | None = None
    network_policy: dict | None = None
    owner: str | None = None  # the tenant's name; None: the default tenant (the admin's)

    def transition(
        self, state: SandboxState, reason: str | None = None, message: str | None = None
    ) -> None:
        now = utcnow()
        if state != self.state:
            self.last_transition_at = now
        self.state = state
        self.reason = reason
        self.message = message
        self.updated_at = now
