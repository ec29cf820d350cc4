"""Snapshot routes (``Snapshots`` in sandbox-lifecycle.yml), served under /v1 and unversioned."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from sandlot.server.api.schemas import rfc3339
from sandlot.server.snapshot_models import SnapshotRecord
from sandlot.server.snapshots import SnapshotService

router = APIRouter()


class CreateSnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, min_length=1)


def _snapshots(request: Request) -> SnapshotService:
    return request.app.state.snapshots  # type: ignore[no-any-return]


def snapshot_json(rec: SnapshotRecord) -> dict[str, Any]:
    status: dict[str, Any] = {"state": rec.state.value,
                              "lastTransitionAt": rfc3339(rec.last_transition_at)}
    if rec.reason:
        status["reason"] = rec.reason
    if rec.message:
        status["message"] = rec.message
    out: dict[str, Any] = {"id": rec.id, "sandboxId": rec.sandbox_id, "status": status,
                           "createdAt": rfc3339(rec.created_at)}
    if rec.name is not None:
        out["name"] = rec.name
    return out


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=202)
async def create_snapshot(
    request: Request, sandbox_id: str,
    body: Annotated[CreateSnapshotRequest | None, Body()] = None,
) -> JSONResponse:
    _snapshots(request).require_support()  # 501 before 404: the route itself is unsupported
    sandbox = request.app.state.service.get(sandbox_id)
    rec = await _snapshots(request).create(sandbox_id, sandbox.state, sandbox.image_uri,
                                           sandbox.entrypoint, body.name if body else None,
                                           owner=sandbox.owner)
    return JSONResponse(snapshot_json(rec), status_code=202,
                        headers={"Location": f"/v1/snapshots/{rec.id}"})


@router.get("/snapshots")
async def list_snapshots(
    request: Request,
    sandbox_id: Annotated[str | None, Query(alias="sandboxId")] = None,
    name: str | None = None,
    state: Annotated[list[str] | None, Query()] = None,
    page: Annotated[int, Query(ge=1)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    result = _snapshots(request).search(sandbox_id, name, state, page, page_size)
    return {
        "items": [snapshot_json(r) for r in result.items],
        "pagination": {
            "page": result.page, "pageSize": result.page_size,
            "totalItems": result.total_items, "totalPages": result.total_pages,
            "hasNextPage": result.page < result.total_pages,
        },
    }


@router.get("/snapshots/{snapshot_id}")
async def get_snapshot(request: Request, snapshot_id: str) -> dict[str, Any]:
    return snapshot_json(_snapshots(request).get(snapshot_id))


@router.delete("/snapshots/{snapshot_id}", status_code=204)
async def delete_snapshot(request: Request, snapshot_id: str) -> Response:
    await _snapshots(request).delete(snapshot_id)
    return Response(status_code=204)
