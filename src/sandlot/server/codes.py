"""Error codes and status reasons of the lifecycle API, as the reference server spells them.

Clients see these strings (``SandboxApiException.error.code``, ``status.reason``), so they
follow the reference's single-host (Docker) server: an app written against it that checks a
code or a reason sees the same string here. docs/compatibility.md lists each one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandlot.runtime.base import ContainerInfo

# ----- error codes -----------------------------------------------------------------------
MISSING_API_KEY = "MISSING_API_KEY"
INVALID_API_KEY = "INVALID_API_KEY"
SANDBOX_NOT_FOUND = "DOCKER::SANDBOX_NOT_FOUND"
SANDBOX_NOT_RUNNING = "DOCKER::SANDBOX_NOT_RUNNING"
SANDBOX_NOT_PAUSED = "DOCKER::SANDBOX_NOT_PAUSED"
SANDBOX_PAUSE_FAILED = "DOCKER::SANDBOX_PAUSE_FAILED"
SANDBOX_RESUME_FAILED = "DOCKER::SANDBOX_RESUME_FAILED"
SANDBOX_DELETE_FAILED = "DOCKER::SANDBOX_DELETE_FAILED"
SANDBOX_START_FAILED = "DOCKER::SANDBOX_START_FAILED"
IMAGE_PULL_FAILED = "DOCKER::SANDBOX_IMAGE_PULL_FAILED"
INVALID_EXPIRATION = "DOCKER::INVALID_EXPIRATION"
INVALID_PORT = "DOCKER::INVALID_PORT"
INVALID_PARAMETER = "SANDBOX::INVALID_PARAMETER"
INVALID_METADATA_LABEL = "SANDBOX::INVALID_METADATA_LABEL"
# The metadata PATCH route's reserved-key check uses the code without its prefix.
RESERVED_METADATA_KEY = "INVALID_METADATA_LABEL"
INVALID_METADATA_FORMAT = "INVALID_METADATA_FORMAT"
API_NOT_SUPPORTED = "SANDBOX::API_NOT_SUPPORTED"
UNSUPPORTED_POOL_REF = "SANDBOX::UNSUPPORTED_POOL_REF"
SNAPSHOT_NOT_IMPLEMENTED = "SNAPSHOT::NOT_IMPLEMENTED"
DIAGNOSTICS_NOT_IMPLEMENTED = "DIAGNOSTICS_NOT_IMPLEMENTED"
DIAGNOSTICS_SCOPE_UNSUPPORTED = "DIAGNOSTICS_SCOPE_UNSUPPORTED"
POOL_NOT_SUPPORTED = "KUBERNETES::POOL_NOT_SUPPORTED"
# Where the reference has the operation (its Kubernetes pools, its snapshots), its codes.
POOL_NOT_FOUND = "KUBERNETES::POOL_NOT_FOUND"
POOL_ALREADY_EXISTS = "KUBERNETES::POOL_ALREADY_EXISTS"
SNAPSHOT_INVALID_SOURCE_STATE = "SNAPSHOT::INVALID_SOURCE_STATE"
# sandlot's own, for operations the reference does not have (network policy changes,
# hibernation): a 409 naming the state that refuses it.
STATE_CONFLICT = "SANDBOX_STATE_CONFLICT"
# Bodies FastAPI itself rejects (422) and plain HTTP errors carry no code on the reference;
# sandlot adds these beside the reference's ``detail``.
VALIDATION_ERROR = "INVALID_REQUEST"
UNKNOWN_ERROR = "GENERAL::UNKNOWN_ERROR"

# ----- status reasons (``status.reason``) and their messages ------------------------------
RUNNING = "CONTAINER_RUNNING"
RUNNING_MESSAGE = "Sandbox container is running."
STARTED_MESSAGE = "Sandbox container started successfully."
PAUSED = "CONTAINER_PAUSED"
PAUSED_MESSAGE = "Sandbox container is paused."
STARTING = "CONTAINER_STARTING"
STARTING_MESSAGE = "Sandbox container is starting."
EXITED_ERROR = "CONTAINER_EXITED_ERROR"
PROVISIONING_ERROR = "PROVISIONING_ERROR"
# sandlot's own transitional states (the reference's Docker calls are synchronous and never
# show them); used with Pausing, Resuming and Stopping.
PAUSING = "CONTAINER_PAUSING"
RESUMING = "CONTAINER_RESUMING"
STOPPING = "CONTAINER_STOPPING"


def with_reason(message: str, info: ContainerInfo) -> str:
    """A Failed sandbox's message, with the runtime's account of why when it has one
    (e.g. a Pod's eviction message)."""
    return f"{message} ({info.reason})" if info.reason else message
# The reference's Kubernetes answer to pause/resume of a workload kind that cannot pause
# (a 400, as for its plain-Pod providers).
K8S_INVALID_STATE = "KUBERNETES::INVALID_STATE"
