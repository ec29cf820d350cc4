"""What a Pod's status means for its sandbox: running, starting, failed (and why)."""

from __future__ import annotations

from typing import Any

from sandlot.errors import ImageNotFound, ImagePullError, RuntimeFailure, SandlotError
from sandlot.runtime.base import ContainerInfo, ContainerState
from sandlot.runtime.kubernetes.pod import SANDBOX_CONTAINER

_PULL_ERRORS = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                "RegistryUnavailable"}
_START_ERRORS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                 "CrashLoopBackOff", "PreStartHookError"}
_NOT_FOUND_HINTS = ("not found", "manifest unknown", "does not exist", "neverpull",
                    "never pull", "repository does not exist", "pull access denied")


def _statuses(pod: Any, init: bool = False) -> list[Any]:
    status = pod.status
    return list((status.init_container_statuses if init else status.container_statuses) or [])


def settled(pod: Any) -> bool:
    """The Pod runs (with an address), has ended, or cannot start."""
    phase = pod.status.phase or ""
    if phase == "Running" and pod.status.pod_ip:
        return True
    if phase in ("Failed", "Succeeded") or pod.metadata.deletion_timestamp is not None:
        return True
    return _stuck(pod) is not None


def _stuck(pod: Any) -> tuple[bool, Any] | None:
    """(is it the init container, its status) of a container that cannot start."""
    for init in (True, False):
        for cs in _statuses(pod, init):
            waiting = cs.state.waiting if cs.state is not None else None
            if waiting is not None and waiting.reason in _PULL_ERRORS | _START_ERRORS:
                return init, cs
            terminated = cs.state.terminated if cs.state is not None else None
            if init and terminated is not None and terminated.exit_code != 0:
                return init, cs
    return None


def start_error(pod: Any, image: str, bundle_image: str) -> SandlotError | None:
    """Why a settled Pod is not a running sandbox (None: it runs)."""
    stuck = _stuck(pod)
    if stuck is not None:
        init, cs = stuck
        waiting = cs.state.waiting
        if waiting is None:
            t = cs.state.terminated
            return RuntimeFailure(f"installing execd failed (exit code {t.exit_code}): "
                                  f"{t.message or t.reason}")
        detail = f"{waiting.reason}: {waiting.message or ''}".strip(": ")
        if init and waiting.reason in _PULL_ERRORS:
            return RuntimeFailure(
                f"the node cannot get sandlot's execd bundle image {bundle_image} ({detail}); "
                "load it into the nodes or push it to their registry "
                "(`sandlot kubernetes bundle-image`, docs/runtime-kubernetes.md)")
        if waiting.reason in _PULL_ERRORS:
            text = detail.lower()
            if waiting.reason == "ErrImageNeverPull" or any(h in text for h in _NOT_FOUND_HINTS):
                return ImageNotFound(f"image {image} not found: {detail}")
            return ImagePullError(f"cannot pull image {image}: {detail}")
        return RuntimeFailure(f"the sandbox container cannot start: {detail}")
    if pod.metadata.deletion_timestamp is not None:
        return RuntimeFailure("the Pod was deleted while it started")
    phase = pod.status.phase or ""
    if phase in ("Failed", "Succeeded"):
        return RuntimeFailure(f"the Pod {phase.lower()} while it started: {reason(pod)}")
    return None


def reason(pod: Any) -> str:
    """The Pod status's own account of why it stopped (eviction, OOM, exit code)."""
    parts = []
    status = pod.status
    if status.reason:
        parts.append(str(status.reason))
    if status.message:
        parts.append(str(status.message))
    for cs in _statuses(pod):
        t = cs.state.terminated if cs.state is not None else None
        if cs.name == SANDBOX_CONTAINER and t is not None:
            parts.append(f"container {t.reason or 'terminated'} with exit code {t.exit_code}")
    return "; ".join(parts) or f"Pod phase {status.phase}"


def gone_reason(pod: Any) -> str:
    """Why a Pod that vanished is gone (its last status, if it said anything)."""
    last = reason(pod) if pod.status is not None else ""
    base = f"the Pod {pod.metadata.name} was deleted from the cluster"
    return f"{base} ({last})" if last and not last.startswith("Pod phase") else base


def exit_code(pod: Any) -> int | None:
    for cs in _statuses(pod):
        t = cs.state.terminated if cs.state is not None else None
        if cs.name == SANDBOX_CONTAINER and t is not None:
            return int(t.exit_code)
    return None


def info(sandbox_id: str, pod: Any) -> ContainerInfo:
    phase = pod.status.phase or ""
    if pod.metadata.deletion_timestamp is not None:
        return ContainerInfo(sandbox_id, ContainerState.STOPPED, exit_code=exit_code(pod),
                             reason=f"the Pod is being deleted ({reason(pod)})")
    if phase == "Running":
        return ContainerInfo(sandbox_id, ContainerState.RUNNING)
    if phase in ("Failed", "Succeeded"):
        return ContainerInfo(sandbox_id, ContainerState.STOPPED, exit_code=exit_code(pod),
                             reason=reason(pod))
    return ContainerInfo(sandbox_id, ContainerState.CREATED)


def describe(pod: Any) -> str:
    """A one-line account of a Pod that is not running yet (scheduling, pulls)."""
    stuck = _stuck(pod)
    if stuck is not None:
        w = stuck[1].state.waiting
        return f"{w.reason}: {w.message}" if w is not None else "init container failed"
    for cond in pod.status.conditions or []:
        if cond.status != "True" and cond.message:
            return f"{cond.type}: {cond.reason}: {cond.message}"
    for init in (True, False):
        for cs in _statuses(pod, init):
            w = cs.state.waiting if cs.state is not None else None
            if w is not None:
                return f"{cs.name}: {w.reason} {w.message or ''}".strip()
    return f"phase {pod.status.phase}"
