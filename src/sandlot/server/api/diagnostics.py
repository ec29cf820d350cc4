"""Diagnostic API routes (diagnostic-api.yml): not offered yet, and saying so.

Without these routes a client would get a plain 404, which ``osb diagnostics``/``osb devops``
report as "sandbox not found". The reference server answers requests it does not implement
with 501 ``DIAGNOSTICS_NOT_IMPLEMENTED``; sandlot does the same for every diagnostics route,
after the usual 404 for an unknown sandbox.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from sandlot.errors import Unsupported
from sandlot.server import codes

router = APIRouter()


@router.get("/sandboxes/{sandbox_id}/diagnostics/{kind}")
async def diagnostics(request: Request, sandbox_id: str, kind: str) -> None:
    request.app.state.service.get(sandbox_id)
    raise Unsupported(
        f"The diagnostics API ({kind}) is not offered by this server yet.",
        code=codes.DIAGNOSTICS_NOT_IMPLEMENTED,
    )
