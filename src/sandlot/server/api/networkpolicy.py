"""Lifecycle routes of a sandbox's egress policy: ``/sandboxes/{id}/networkpolicy``.

The same semantics as the egress API on port 18080 (GET the policy and its mode, PUT
replaces, PATCH merges with the first rule of each target winning, DELETE removes rules by
target), for clients that talk to the control plane only (the SDKs use it for template
sandboxes). Invalid rules answer 400 naming the rule.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from sandlot.net.policy import (
    EgressPolicy,
    PolicyError,
    parse_policy,
    parse_rules,
    parse_targets,
)
from sandlot.server.service import SandboxService

router = APIRouter()


def _svc(request: Request) -> SandboxService:
    return request.app.state.service  # type: ignore[no-any-return]


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise PolicyError("the request body is empty")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"the request body is not JSON: {exc}") from None


def _status(svc: SandboxService, policy: EgressPolicy, reason: str | None = None) -> dict:
    out: dict[str, Any] = {"status": "ok", "mode": policy.mode,
                           "enforcementMode": svc.cfg.egress.mode,
                           "policy": policy.to_json()}
    if reason:
        out["reason"] = reason
    return out


@router.get("/sandboxes/{sandbox_id}/networkpolicy")
async def get_policy(request: Request, sandbox_id: str) -> dict:
    svc = _svc(request)
    return _status(svc, svc.network_policy(sandbox_id))


@router.put("/sandboxes/{sandbox_id}/networkpolicy")
async def put_policy(request: Request, sandbox_id: str) -> dict:
    svc = _svc(request)
    svc.get(sandbox_id)
    policy = parse_policy(await _body(request))
    return _status(svc, await svc.set_network_policy(sandbox_id, policy))


@router.patch("/sandboxes/{sandbox_id}/networkpolicy")
async def patch_policy(request: Request, sandbox_id: str) -> dict:
    svc = _svc(request)
    current = svc.network_policy(sandbox_id)
    rules = parse_rules(await _body(request), "rules")
    if not rules:
        raise PolicyError("the body must be a non-empty list of rules")
    return _status(svc, await svc.set_network_policy(sandbox_id, current.patched(rules)))


@router.delete("/sandboxes/{sandbox_id}/networkpolicy")
async def delete_rules(request: Request, sandbox_id: str) -> dict:
    svc = _svc(request)
    current = svc.network_policy(sandbox_id)
    new = current.without(parse_targets(await _body(request)))
    if new == current:
        return _status(svc, current, "no matching targets found")
    return _status(svc, await svc.set_network_policy(sandbox_id, new))
