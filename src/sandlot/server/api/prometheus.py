"""``GET /metrics``: the Prometheus text format (behind the API key unless [metrics] open)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sandlot.errors import Forbidden
from sandlot.server.metrics import CONTENT_TYPE
from sandlot.server.tenancy import principal as tenancy

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    # Series name every tenant's sandboxes: the administrator's (or, with [metrics] open,
    # whoever can reach the port).
    if not request.app.state.observability.cfg.metrics.open and not tenancy.current().admin:
        raise Forbidden("/metrics is the administrator's: its series cover every tenant's "
                        "sandboxes", code="ADMIN_ONLY")
    return Response(request.app.state.observability.metrics.exposition(),
                    media_type=CONTENT_TYPE)
