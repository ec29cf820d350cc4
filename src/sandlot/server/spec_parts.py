"""Request fields -> the runtime boundary's typed parts (volumes, network policy).

The lifecycle API keeps OpenSandbox's JSON shapes; runtimes get ``VolumeSpec`` and
``NetworkPolicy`` (``sandlot.runtime.base``) and never parse request JSON themselves.
"""

from __future__ import annotations

from typing import Any

from sandlot.errors import InvalidRequest
from sandlot.net.policy import parse_policy
from sandlot.runtime.base import EgressRule, NetworkPolicy, VolumeSpec

# The backend structs of an OpenSandbox Volume; exactly one per entry.
VOLUME_KINDS = ("host", "pvc", "ossfs")
_SOURCE_KEY = {"host": "path", "pvc": "claimName", "ossfs": "bucket"}


def volume_kind(volume: dict[str, Any]) -> str:
    kinds = [k for k in VOLUME_KINDS if volume.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidRequest(
            f"volume {volume.get('name')!r} must have exactly one backend "
            f"({', '.join(VOLUME_KINDS)}), got {len(kinds)}"
        )
    return kinds[0]


def volume_specs(volumes: list[dict[str, Any]] | None) -> list[VolumeSpec]:
    specs = []
    for v in volumes or []:
        kind = volume_kind(v)
        backend = dict(v[kind]) if isinstance(v[kind], dict) else {}
        specs.append(VolumeSpec(
            name=str(v.get("name", "")), kind=kind,
            source=str(backend.pop(_SOURCE_KEY[kind], "")),
            mount_path=str(v.get("mountPath", "")), read_only=bool(v.get("readOnly", False)),
            sub_path=v.get("subPath"), options=backend,
        ))
    return specs


def network_policy(raw: dict[str, Any] | None) -> NetworkPolicy | None:
    """The request's ``networkPolicy`` with the egress component's semantics (validated;
    ``defaultAction`` defaults to deny); None (no restriction) for none or ``{}``."""
    policy = parse_policy(raw)
    if policy.allows_everything:
        return None
    return NetworkPolicy(default_action=policy.default_action, egress=tuple(
        EgressRule(action=r.action, target=r.target) for r in policy.egress))
