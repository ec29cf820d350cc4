"""One place that turns every failure into the contract's ``{code, message}`` body.

Where the reference server answers with FastAPI's own body instead (422 validation errors,
unknown routes and methods: ``{"detail": ...}``), sandlot sends that ``detail`` too, beside
``code`` and ``message``: clients written against either shape find what they read.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandlot.errors import SandlotError
from sandlot.server import codes

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    422: "INVALID_REQUEST",
}


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SandlotError)
    async def _sandlot(_req: Request, exc: SandlotError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        body = {
            "code": codes.VALIDATION_ERROR,
            "message": _describe(exc),
            "detail": jsonable_encoder(exc.errors()),
        }
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, codes.UNKNOWN_ERROR)
        body = {"code": code, "message": str(exc.detail), "detail": exc.detail}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
