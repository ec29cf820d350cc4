"""A named pool as the control plane keeps it (``/v1/pools``, the reference's Pool resource)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandlot.errors import InvalidRequest

# The parts of the reference's Kubernetes PodTemplateSpec that mean something here.
_CONTAINER_KEYS = {"name", "image", "resources"}


@dataclass
class PoolRecord:
    name: str
    template: dict[str, Any]  # {"spec": {"containers": [{"image": ..., "resources": ...}]}}
    capacity: dict[str, int]  # bufferMin, bufferMax, poolMin, poolMax
    revision: int
    created_at: datetime

    @property
    def image(self) -> str:
        return str(_container(self.template)["image"])

    @property
    def resource_limits(self) -> dict[str, str]:
        limits = (_container(self.template).get("resources") or {}).get("limits") or {}
        return {str(k): str(v) for k, v in limits.items()}

    @property
    def size(self) -> int:
        """How many pre-started sandboxes to keep ready."""
        return int(self.capacity["bufferMax"])


def _container(template: dict[str, Any]) -> dict[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or []
    return containers[0]  # type: ignore[no-any-return]


def check_template(template: dict[str, Any]) -> None:
    """Refuse what sandlot would not honour: one container with an image (and limits)."""
    extra = set(template) - {"metadata", "spec"}
    spec = template.get("spec")
    if extra or not isinstance(spec, dict):
        got = f" (got {', '.join(sorted(extra))})" if extra else ""
        raise InvalidRequest("pool template: give {\"spec\": {\"containers\": [{\"image\": ...,"
                             " \"resources\": {\"limits\": {...}}}]}}; other fields are not "
                             f"supported{got}")
    containers = spec.get("containers")
    if set(spec) - {"containers"} or not isinstance(containers, list) or len(containers) != 1:
        raise InvalidRequest("pool template: spec must hold exactly one entry in containers "
                             "(other pod fields are not supported)")
    c = containers[0]
    if not isinstance(c, dict) or not isinstance(c.get("image"), str) or not c["image"]:
        raise InvalidRequest("pool template: the container needs an image")
    unknown = set(c) - _CONTAINER_KEYS
    if unknown:
        raise InvalidRequest(f"pool template: container fields {', '.join(sorted(unknown))} are "
                             "not supported (only name, image, resources.limits)")
    resources = c.get("resources") or {}
    if not isinstance(resources, dict) or set(resources) - {"limits"}:
        raise InvalidRequest("pool template: only resources.limits is supported")
    limits = resources.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"cpu", "memory"}:
        raise InvalidRequest("pool template: resources.limits may hold cpu and memory")
