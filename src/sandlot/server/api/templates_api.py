"""Template routes (``/templates`` as the released SDK 1.1.1 calls them); see templates.py."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sandlot.server.templates import TemplateService

router = APIRouter()


def _templates(request: Request) -> TemplateService:
    return request.app.state.templates  # type: ignore[no-any-return]


@router.post("/templates", status_code=201)
async def create_template(request: Request,
                          body: Annotated[dict[str, Any], Body()]) -> JSONResponse:
    svc = _templates(request)
    return JSONResponse(svc.public(await svc.create(body)), status_code=201)


@router.get("/templates")
async def list_templates(
    request: Request,
    metadata: str | None = None,
    page: Annotated[int, Query(ge=1)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    svc = _templates(request)
    items = svc.search(dict(parse_qsl(metadata)) if metadata else None)
    total = len(items)
    pages = (total + page_size - 1) // page_size
    chunk = items[(page - 1) * page_size: page * page_size]
    return {"items": [svc.public(r) for r in chunk],
            "pagination": {"page": page, "pageSize": page_size, "totalItems": total,
                           "totalPages": pages, "hasNextPage": page < pages}}


@router.get("/templates/{template_id}")
async def get_template(request: Request, template_id: str) -> dict[str, Any]:
    svc = _templates(request)
    return svc.public(svc.get(template_id))


@router.get("/templates/{template_id}/logs")
async def template_logs(request: Request, template_id: str) -> PlainTextResponse:
    """The build's output (sandlot's addition: the SDK has no call for it)."""
    return PlainTextResponse(_templates(request).get(template_id)["buildLog"])


@router.delete("/templates/{template_id}", status_code=204)
async def delete_template(request: Request, template_id: str) -> Response:
    await _templates(request).delete(template_id)
    return Response(status_code=204)
