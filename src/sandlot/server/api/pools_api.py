"""Pool routes (the reference server's ``/pools``), served under /v1 and unversioned."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from sandlot.server.api.schemas import rfc3339
from sandlot.server.pool_models import PoolRecord
from sandlot.server.pools import PoolService
from sandlot.server.tenancy.principal import require_admin

router = APIRouter()


class CreatePoolRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253)
    template: dict[str, Any]
    capacity_spec: dict[str, Any] = Field(alias="capacitySpec")


class UpdatePoolRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    capacity_spec: dict[str, Any] = Field(alias="capacitySpec")


def _pools(request: Request) -> PoolService:
    return request.app.state.pools  # type: ignore[no-any-return]


def pool_json(svc: PoolService, rec: PoolRecord) -> dict[str, Any]:
    return {"name": rec.name, "capacitySpec": rec.capacity, "status": svc.status(rec),
            "createdAt": rfc3339(rec.created_at)}


@router.post("/pools", status_code=201)
async def create_pool(request: Request, body: CreatePoolRequest) -> JSONResponse:
    require_admin("creating a pool")
    svc = _pools(request)
    rec = await svc.create(body.name, body.template, body.capacity_spec)
    return JSONResponse(pool_json(svc, rec), status_code=201)


@router.get("/pools")
async def list_pools(request: Request) -> dict[str, Any]:
    svc = _pools(request)
    return {"items": [pool_json(svc, r) for r in svc.list()]}


@router.get("/pools/{name}")
async def get_pool(request: Request, name: str) -> dict[str, Any]:
    svc = _pools(request)
    return pool_json(svc, svc.get(name))


@router.put("/pools/{name}")
async def update_pool(request: Request, name: str, body: UpdatePoolRequest) -> dict[str, Any]:
    require_admin("resizing a pool")
    svc = _pools(request)
    return pool_json(svc, await svc.update(name, body.capacity_spec))


@router.delete("/pools/{name}", status_code=204)
async def delete_pool(request: Request, name: str) -> Response:
    require_admin("deleting a pool")
    await _pools(request).delete(name)
    return Response(status_code=204)
