"""Lifecycle routes (sandbox-lifecycle.yml), served under /v1 and unversioned."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, Response

from sandlot.errors import InvalidRequest
from sandlot.server import codes
from sandlot.server.api.schemas import (
    CreateSandboxRequest,
    RenewRequest,
    rfc3339,
    sandbox_json,
)
from sandlot.server.models import SandboxState
from sandlot.server.service import SandboxService

router = APIRouter()


def _svc(request: Request) -> SandboxService:
    return request.app.state.service  # type: ignore[no-any-return]


def _metadata_filter(raw: str | None) -> dict[str, str] | None:
    if not raw:
        return None
    try:  # strict, as on the reference: "a=1&broken" is refused, not half-read
        pairs = parse_qsl(raw, keep_blank_values=True, strict_parsing=True)
    except ValueError as exc:
        raise InvalidRequest(
            f"Invalid metadata filter {raw!r}: {exc}", code=codes.INVALID_METADATA_FORMAT
        ) from exc
    return dict(pairs) or None


@router.post("/sandboxes", status_code=202)
async def create_sandbox(request: Request, body: CreateSandboxRequest) -> JSONResponse:
    rec = await _svc(request).create(body)
    answer = sandbox_json(rec, full=False)
    if rec.state == SandboxState.RUNNING:  # the reference's words for a create that started
        answer["status"]["message"] = codes.STARTED_MESSAGE
    return JSONResponse(
        answer,
        status_code=202,
        headers={"Location": f"/v1/sandboxes/{rec.id}"},
    )


@router.get("/sandboxes")
async def list_sandboxes(
    request: Request,
    state: Annotated[list[str] | None, Query()] = None,
    metadata: Annotated[str | None, Query()] = None,
    page: Annotated[int, Query(ge=1)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=200)] = 20,
) -> dict:
    result = _svc(request).list(state, _metadata_filter(metadata), page, page_size)
    return {
        "items": [sandbox_json(r) for r in result.items],
        "pagination": {
            "page": result.page,
            "pageSize": result.page_size,
            "totalItems": result.total_items,
            "totalPages": result.total_pages,
            "hasNextPage": result.has_next_page,
        },
    }


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(request: Request, sandbox_id: str) -> dict:
    return sandbox_json(_svc(request).get(sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def delete_sandbox(request: Request, sandbox_id: str) -> Response:
    await _svc(request).delete(sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=202)
async def pause_sandbox(request: Request, sandbox_id: str) -> Response:
    await _svc(request).pause(sandbox_id)
    return Response(status_code=202)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=202)
async def resume_sandbox(request: Request, sandbox_id: str) -> Response:
    await _svc(request).resume(sandbox_id)
    return Response(status_code=202)


@router.post("/sandboxes/{sandbox_id}/renew-expiration")
async def renew_expiration(request: Request, sandbox_id: str, body: RenewRequest) -> dict:
    rec = await _svc(request).renew(sandbox_id, body.expires_at)
    assert rec.expires_at is not None
    return {"expiresAt": rfc3339(rec.expires_at)}


@router.patch("/sandboxes/{sandbox_id}/metadata")
async def patch_metadata(
    request: Request,
    sandbox_id: str,
    patch: Annotated[dict[str, str | None], Body()],
) -> dict:
    return sandbox_json(await _svc(request).patch_metadata(sandbox_id, patch))


@router.get("/sandboxes/{sandbox_id}/endpoints/{port}")
async def get_endpoint(
    request: Request,
    sandbox_id: str,
    port: int,
    use_server_proxy: bool = False,
    expires: int | None = None,
) -> dict:
    # The reference's order of checks: proxy+expires, expires, port range, then the sandbox.
    if expires is not None:
        if use_server_proxy:
            raise InvalidRequest(
                "use_server_proxy and expires cannot be combined: signed endpoints go through "
                "a gateway route, not the server proxy.",
                code=codes.INVALID_PARAMETER,
            )
        raise InvalidRequest(
            "Signed endpoints (the expires parameter) are not supported by this server: it "
            "has no ingress gateway to sign routes for.",
            code=codes.API_NOT_SUPPORTED,
        )
    if not 1 <= port <= 65535:
        raise InvalidRequest("Port must be between 1 and 65535.", code=codes.INVALID_PORT)
    authority = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
    return await _svc(request).endpoint(sandbox_id, port, use_server_proxy, authority)
