"""Diagnostic API routes (diagnostic-api.yml) and the deprecated DevOps plain-text ones.

With ``scope``: the JSON descriptor of the spec, delivered inline or, per ``[diagnostics]
delivery``, by a short-lived download URL (``diagnostic_downloads``). Without it: the plain
text the reference's DevOps routes answer (``osb devops logs/events``), marked
``Deprecation: true`` as there; ``inspect`` and ``summary`` are plain text only. The work is
``DiagnosticsService``'s (``sandlot.server.diagnostics``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from sandlot.errors import NotFound
from sandlot.server.diagnostic_downloads import PATH_PREFIX, DiagnosticDownloads
from sandlot.server.diagnostics import CONTENT_TYPE, Content, DiagnosticsService

router = APIRouter()
# Mounted once, at PATH_PREFIX, and reachable without the API key (the token is the key).
downloads_router = APIRouter()


def _diagnostics(request: Request) -> DiagnosticsService:
    found: DiagnosticsService = request.app.state.diagnostics
    return found


def _descriptor(request: Request, sandbox_id: str, kind: str, scope: str,
                content: Content) -> JSONResponse:
    body: dict[str, Any] = {
        "sandboxId": sandbox_id, "kind": kind, "scope": scope, "delivery": "inline",
        "contentType": CONTENT_TYPE, "truncated": content.truncated,
    }
    payload = content.text.encode()
    cfg = request.app.state.service.cfg.diagnostics
    if cfg.delivery == "url" or (cfg.delivery == "auto" and len(payload) > cfg.max_inline_bytes):
        downloads: DiagnosticDownloads = request.app.state.diagnostic_downloads
        path, expires = downloads.put(payload)
        body["delivery"] = "url"
        body["contentUrl"] = str(request.base_url).rstrip("/") + path
        body["expiresAt"] = datetime.fromtimestamp(expires, UTC).isoformat(
            timespec="seconds").replace("+00:00", "Z")
    else:
        body["content"] = content.text
    body["contentLength"] = len(payload)
    if content.warnings:
        body["warnings"] = content.warnings
    return JSONResponse(body)


def _deprecated(text: str) -> PlainTextResponse:
    return PlainTextResponse(text, headers={"Deprecation": "true"})


@router.get("/sandboxes/{sandbox_id}/diagnostics/context")
async def diagnostic_context(request: Request, sandbox_id: str) -> dict[str, Any]:
    return await _diagnostics(request).context(sandbox_id)


@router.get("/sandboxes/{sandbox_id}/diagnostics/logs", response_model=None)
async def diagnostic_logs(
    request: Request, sandbox_id: str, scope: str | None = None,
    tail: int = Query(100, ge=1, le=10000), since: str | None = None,
) -> JSONResponse | PlainTextResponse:
    diagnostics = _diagnostics(request)
    if scope is None:
        return _deprecated(await diagnostics.legacy_logs(sandbox_id, tail, since))
    return _descriptor(request, sandbox_id, "logs", scope,
                       await diagnostics.logs(sandbox_id, scope))


@router.get("/sandboxes/{sandbox_id}/diagnostics/events", response_model=None)
async def diagnostic_events(
    request: Request, sandbox_id: str, scope: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> JSONResponse | PlainTextResponse:
    diagnostics = _diagnostics(request)
    if scope is None:
        return _deprecated(await diagnostics.legacy_events(sandbox_id, limit))
    return _descriptor(request, sandbox_id, "events", scope,
                       await diagnostics.events(sandbox_id, scope))


@router.get("/sandboxes/{sandbox_id}/diagnostics/inspect")
async def diagnostic_inspect(request: Request, sandbox_id: str) -> PlainTextResponse:
    return PlainTextResponse(await _diagnostics(request).inspect(sandbox_id))


@router.get("/sandboxes/{sandbox_id}/diagnostics/summary")
async def diagnostic_summary(
    request: Request, sandbox_id: str, tail: int = Query(50, ge=1, le=10000),
    event_limit: int = Query(20, ge=1, le=500),
) -> PlainTextResponse:
    return PlainTextResponse(await _diagnostics(request).summary(sandbox_id, tail, event_limit))


@downloads_router.get(PATH_PREFIX + "{token}", include_in_schema=False)
async def diagnostic_download(request: Request, token: str) -> Response:
    downloads: DiagnosticDownloads = request.app.state.diagnostic_downloads
    body = downloads.get(token)
    if body is None:
        raise NotFound("This diagnostics download URL is unknown or has expired; request the "
                       "diagnostics again for a new one.", code="DIAGNOSTICS_DOWNLOAD_NOT_FOUND")
    return Response(body, media_type=CONTENT_TYPE,
                    headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
