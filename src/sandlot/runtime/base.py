"""The runtime boundary: what the control plane asks of a backend (oci, docker, ...).

The control plane (``sandlot.server``) owns lifecycle rules and state; a runtime runs
containers, resolves their images, and is the only way into them: ``connect`` hands back a
connected socket to a port inside the sandbox (execd's port included), so the server never
learns host paths, sockets or namespaces of a backend. What a backend can do is declared in
``capabilities``; the server derives its "not supported" answers from it.

All methods are idempotent where it makes sense (delete of a missing sandbox is not an
error) so that recovery after a crash can simply call them again. Backends register under
the ``sandlot.runtimes`` entry-point group (see ``sandlot.runtime.registry``).
"""

from __future__ import annotations

import abc
import enum
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sandlot.images.model import RegistryAuth

if TYPE_CHECKING:
    from sandlot.config import Config

__all__ = [
    "ContainerInfo", "ContainerState", "CreateResult", "EgressRule", "ImageRef", "NetworkPolicy",
    "Progress", "RegistryAuth", "ResourceUsage", "Runtime", "RuntimeCapabilities", "SandboxSpec",
    "StateListener", "VolumeSpec", "WarmPoolStats",
]


@dataclass(frozen=True)
class ImageRef:
    """An image as the client asked for it; each runtime resolves it itself."""

    reference: str  # e.g. "python:3.12", "base", "host:5000/team/app@sha256:..."
    auth: RegistryAuth | None = None
    platform: str | None = None  # "linux/amd64"; None = the host's


@dataclass(frozen=True)
class VolumeSpec:
    """One volume of a create request (OpenSandbox ``volumes[]``).

    ``kind`` is the backend-neutral type ("host", "pvc", "ossfs", ...): a runtime supports
    the kinds listed in ``capabilities.volume_kinds``; ``source`` is kind-specific (host
    path, claim name, ...), ``options`` holds the rest of the request's fields.
    """

    name: str
    kind: str
    source: str
    mount_path: str
    read_only: bool = False
    sub_path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EgressRule:
    action: str  # "allow" | "deny"
    target: str  # domain, "*.domain", IP or CIDR


@dataclass(frozen=True)
class NetworkPolicy:
    """OpenSandbox ``networkPolicy``: the default action then rules, first match wins."""

    default_action: str = "deny"  # "allow" | "deny"
    egress: tuple[EgressRule, ...] = ()


@dataclass
class SandboxSpec:
    sandbox_id: str
    image: ImageRef
    entrypoint: list[str]  # the user workload; execd is started before it
    env: dict[str, str] = field(default_factory=dict)
    cpu_cores: float | None = None  # e.g. 0.5; None = unlimited
    memory_bytes: int | None = None  # None = unlimited
    disk_bytes: int | None = None  # cap on the writable layer ("ephemeral-storage"); None = none
    # The create's ``resourceRequests`` (backends with ``capabilities.resource_requests``).
    cpu_request_cores: float | None = None
    memory_request_bytes: int | None = None
    pids_limit: int = 4096
    execd_token: str | None = None  # required in X-EXECD-ACCESS-TOKEN when set
    volumes: list[VolumeSpec] = field(default_factory=list)
    network_policy: NetworkPolicy | None = None  # None = unrestricted (as upstream)
    extensions: dict[str, str] = field(default_factory=dict)
    # The create request's metadata (backends that can label their containers show it).
    metadata: dict[str, str] = field(default_factory=dict)
    # Start from this snapshot's filesystem instead of ``image`` (runtimes with snapshots).
    snapshot_id: str | None = None


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What a backend offers; the server answers 501 for anything not listed."""

    pause: bool = True
    hibernate: bool = False
    snapshots: bool = False
    pools: bool = False  # named pools of pre-started sandboxes (``ensure_pool``)
    volume_kinds: frozenset[str] = frozenset()
    disk_limit: bool = False  # enforces SandboxSpec.disk_bytes (resourceLimits ephemeral-storage)
    pvc_size: bool = False  # enforces a pvc volume's ``storage`` size (VolumeSpec.options)
    gpu: bool = False
    network_policy: bool = False
    resource_requests: bool = False  # schedules by SandboxSpec.*_request_* (Kubernetes)
    isolation: str = "runc"  # "runc", "gvisor", "docker", ...: reported at start and in doctor
    platforms: frozenset[str] = frozenset()  # "linux/amd64", ...; empty = any


@dataclass(frozen=True)
class CreateResult:
    """What ``create`` knows when it returns."""

    execd_ready: bool  # execd has answered already (e.g. a claimed warm container)


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
    reason: str | None = None  # e.g. "hibernated": shown in the sandbox's status


@dataclass(frozen=True)
class ResourceUsage:
    """What a sandbox uses now, as its cgroup counts it (None: not known on this backend)."""

    cpu_seconds: float | None = None  # total CPU time used since start
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    oom_kills: int = 0  # processes the kernel killed in it for memory


@dataclass(frozen=True)
class WarmPoolStats:
    """A pool of pre-started sandboxes: how many are ready, and how creates fared."""

    ready: int
    claims: int
    misses: int


# Called by ``create`` with (step, message) while it works; the service shows the Pending
# sandbox as the reference does (reason CONTAINER_STARTING, the step in the message).
# ("Pulling", ...) when it fetches the image (stored at once), ("Starting", ...) when it
# starts the container (kept in memory: it is the common, fast case).
Progress = Callable[[str, str], Awaitable[None]]
# Called by a backend that notices, without being asked, that a sandbox's container stopped
# or vanished (e.g. removed with the engine's own tools): (sandbox id, its state now).
StateListener = Callable[[str, "ContainerInfo"], Awaitable[None]]


class Runtime(abc.ABC):
    """A backend that runs sandboxes as containers (see module docstring)."""

    name: ClassVar[str]
    capabilities: RuntimeCapabilities

    @classmethod
    @abc.abstractmethod
    async def open(cls, cfg: Config) -> Runtime:
        """Check the host, set the backend up and return it; ``RuntimeFailure`` says why not."""

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, progress: Progress | None = None) -> CreateResult:
        """Resolve the image, create and start the sandbox; returns once its init runs.

        Raises ``ImageNotFound``/``ImagePullError`` for images, ``InvalidRequest`` for a spec
        this backend cannot satisfy and ``RuntimeFailure`` if it cannot start; leaves nothing
        behind in those cases.
        """

    @abc.abstractmethod
    async def delete(self, sandbox_id: str) -> None:
        """Kill every process and remove mounts, cgroups and files. Idempotent."""

    @abc.abstractmethod
    async def pause(self, sandbox_id: str) -> None:
        """Freeze all processes; memory is kept (unless the backend hibernates)."""

    @abc.abstractmethod
    async def resume(self, sandbox_id: str) -> None: ...

    @abc.abstractmethod
    async def inspect(self, sandbox_id: str) -> ContainerInfo: ...

    @abc.abstractmethod
    async def list_ids(self) -> set[str]:
        """Ids of all sandboxes this runtime currently holds (for restart reconciliation)."""

    @abc.abstractmethod
    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to ``port`` inside the sandbox.

        The only way into a sandbox, execd's port included. Raises ``NotFound`` for an
        unknown sandbox and ``OSError`` (e.g. ``ConnectionRefusedError``) when nothing
        listens there. The socket must not depend on anything the sandbox can write (no
        host path inside the sandbox's reach is followed).
        """

    def hand_off(self, sandbox_id: str, port: int, conn: socket.socket) -> bool:
        """Give a client's accepted connection to what serves ``port`` in the sandbox, so the
        server need not relay its bytes. True: handed over (the caller closes its own copy);
        False: this backend or port is always relayed. Raises ``OSError`` when it would hand
        it over but cannot now (the caller then relays, through ``connect``).
        """
        return False

    async def check_volumes(self, volumes: list[VolumeSpec]) -> None:
        """Refuse (``InvalidRequest``) volumes this backend cannot mount, before the create is
        accepted: e.g. a pvc that does not exist with ``createIfNotExists`` false.

        The request's shape and host-path allow-list are checked by the server already.
        """
        return None

    def check_network_policy(self, policy: object) -> None:
        """Refuse (``InvalidRequest``) an egress policy this backend cannot enforce as asked on
        its configuration, before a create or a change is accepted (e.g. an address deny on
        a cluster that does not enforce NetworkPolicy)."""
        return None

    async def prewarm(self, image: ImageRef) -> None:
        """Keep pre-started sandboxes of ``image`` ready for fast creates, if supported.

        Returns at once; a runtime without a warm pool does nothing.
        """
        return None

    def watch(self, changed: StateListener) -> None:
        """Report containers that stop or vanish behind the server's back to ``changed``.

        Returns at once. A backend that cannot see such changes does nothing (restart
        reconciliation still finds them).
        """
        return None

    async def ensure_pool(self, name: str, image: ImageRef, size: int,
                          snapshot_id: str | None = None,
                          limits: dict[str, str] | None = None) -> None:
        """Keep ``size`` pre-started sandboxes of ``image`` (or of snapshot ``snapshot_id``)
        for creates naming pool ``name``; ``limits`` are the pool's ``resourceLimits`` (a
        backend that cannot change them at claim starts its sandboxes with them).

        Only called when ``capabilities.pools``. Resolves (pulls) the image, then returns;
        the pool fills in the background. Calling it again changes the size.
        """
        raise NotImplementedError(f"the {self.name} runtime has no pools")

    async def remove_pool(self, name: str) -> None:
        """Stop keeping pool ``name`` and delete its unclaimed sandboxes (idempotent)."""
        raise NotImplementedError(f"the {self.name} runtime has no pools")

    def pool_ready(self, name: str) -> int:
        """How many pre-started sandboxes pool ``name`` holds right now."""
        return 0

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> None:
        """Capture the sandbox's filesystem as snapshot ``snapshot_id``; it keeps running.

        Only called when ``capabilities.snapshots``; blocks until the snapshot is usable.
        """
        raise NotImplementedError(f"the {self.name} runtime has no snapshots")

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot's data (idempotent); ``Conflict`` while something uses it."""
        raise NotImplementedError(f"the {self.name} runtime has no snapshots")

    async def usage(self, sandbox_id: str) -> ResourceUsage | None:
        """CPU, memory and OOM kills of the sandbox (None when unknown or gone).

        Cheap enough to be sampled every few seconds for every sandbox (metrics, OOM events).
        """
        return None

    async def usage_many(self, sandbox_ids: Sequence[str]) -> dict[str, ResourceUsage | None]:
        """``usage`` of each sandbox (None for one that failed or is gone): the periodic
        sample of every live sandbox. One by one here; a runtime that reads them all in one
        worker-thread hop overrides it."""
        found: dict[str, ResourceUsage | None] = {}
        for sandbox_id in sandbox_ids:
            try:
                found[sandbox_id] = await self.usage(sandbox_id)
            except Exception:  # noqa: BLE001 - a sandbox going away while sampled
                found[sandbox_id] = None
        return found

    async def init_log(self, sandbox_id: str, max_bytes: int) -> tuple[bytes, bool] | None:
        """The last ``max_bytes`` of what the sandbox's init (execd) wrote to stdout/stderr,
        as the backend keeps it, and whether older output was cut; None when it keeps none.

        The workload's own output is the entrypoint log, which execd serves itself.
        """
        return None

    def warm_pools(self) -> dict[str, WarmPoolStats]:
        """Pre-started sandbox pools by name ("" = the server's warm pool) for ``/metrics``."""
        return {}

    def diagnostic_ids(self, sandbox_id: str) -> dict[str, str]:
        """Backend-defined identifiers of the sandbox (container id, cgroup, ...), shown by
        ``GET /v1/sandboxes/{id}/diagnostics/context``."""
        return {}

    async def close(self) -> None:
        """Release runtime resources at server shutdown. Sandboxes keep running."""
        return None
