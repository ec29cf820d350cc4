"""The runtime backend interface: what the control plane asks of oci, docker or kubernetes.

The control plane (``sandlot.server``) owns lifecycle rules and state; a runtime only runs
containers. All methods are idempotent where it makes sense (delete of a missing sandbox is
not an error) so that recovery after a crash can simply call them again.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandlot.images.model import Image


@dataclass
class SandboxSpec:
    sandbox_id: str
    image: Image
    entrypoint: list[str]  # the user workload; execd is started before it by the bootstrap
    env: dict[str, str] = field(default_factory=dict)
    cpu_cores: float | None = None  # e.g. 0.5; None = unlimited
    memory_bytes: int | None = None  # None = unlimited
    pids_limit: int = 4096
    execd_token: str | None = None  # required in X-EXECD-ACCESS-TOKEN when set


class ContainerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"  # init process exited
    MISSING = "missing"  # the runtime knows nothing of it


@dataclass
class ContainerInfo:
    sandbox_id: str
    state: ContainerState
    pid: int | None = None
    exit_code: int | None = None


class Runtime(Protocol):
    """A backend that runs sandboxes as containers."""

    name: str

    async def create(self, spec: SandboxSpec) -> bool:
        """Create and start the sandbox; returns once its init process runs.

        Returns True when execd is known to answer already (a warm container whose execd
        accepted the claim), so the caller can skip waiting for ``/ping``. Raises
        ``RuntimeFailure`` if it cannot start; leaves nothing behind in that case.
        """

    async def delete(self, sandbox_id: str) -> None:
        """Kill every process and remove mounts, cgroups and files. Idempotent."""

    async def pause(self, sandbox_id: str) -> None:
        """Freeze all processes (cgroup freezer); memory is kept."""

    async def resume(self, sandbox_id: str) -> None: ...

    async def inspect(self, sandbox_id: str) -> ContainerInfo: ...

    async def list_ids(self) -> set[str]:
        """Ids of all sandboxes this runtime currently holds (for restart reconciliation)."""

    def execd_socket(self, sandbox_id: str) -> Path:
        """Host path of the unix socket execd listens on inside this sandbox."""

    async def open_connection(
        self, sandbox_id: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a TCP connection to ``port`` inside the sandbox (its own network namespace)."""

    async def prewarm(self, image: Image) -> None:
        """Keep pre-started sandboxes of ``image`` ready for fast creates, if supported.

        Returns at once; a runtime without a warm pool does nothing.
        """

    async def close(self) -> None:
        """Release runtime resources at server shutdown. Sandboxes keep running."""
