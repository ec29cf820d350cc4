"""The execd ASGI app: its routes, extension routes, access token and one error shape."""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sandlot.errors import SandlotError
from sandlot.execd import protocol
from sandlot.execd.extension import Extension
from sandlot.execd.http import JSON, error_response
from sandlot.execd.settings import Settings

log = logging.getLogger("sandlot.execd")

TOKEN_HEADER = protocol.TOKEN_HEADER.lower()
OPEN_PATHS = frozenset({protocol.PING_PATH})
_TOKEN_HEADER_BYTES = TOKEN_HEADER.encode()


class TokenAuth:
    """Requires ``X-EXECD-ACCESS-TOKEN`` on every HTTP and WebSocket route but ``/ping``.

    The token is read from ``settings`` on every request: a pooled execd's claim replaces it.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.settings.token.encode() if self.settings.token else None
        if token is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for key, value in scope["headers"]:
            if key == _TOKEN_HEADER_BYTES:
                given = value
                break
        if given and hmac.compare_digest(given, token):
            await self.app(scope, receive, send)
            return
        body = JSON(
            {"code": "UNAUTHORIZED", "message": "missing or invalid X-EXECD-ACCESS-TOKEN header"},
            status_code=401,
        )
        if scope["type"] == "http":
            await body(scope, receive, send)
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "websocket.http.response.body", "body": body.body})
        else:
            await send({"type": "websocket.close", "code": 1008})


async def _sandlot_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandlotError)
    return error_response(exc)


_HTTP_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "HTTP_ERROR")
    return JSON(
        {"code": code, "message": str(exc.detail)},
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSON(
        {"code": "RUNTIME_ERROR", "message": f"{type(exc).__name__}: {exc}"}, status_code=500
    )


async def _ping(request: Request) -> Response:
    return PlainTextResponse("pong")


def build_app(settings: Settings, extensions: Sequence[Extension] = ()) -> Starlette:
    """execd's app; ``extensions`` add routes under the same auth and error handling."""
    from sandlot.execd.commands import CommandService
    from sandlot.execd.files import file_routes
    from sandlot.execd.metrics import MetricsService
    from sandlot.execd.pty import PtyService
    from sandlot.execd.sessions import SessionService

    commands = CommandService(settings)
    sessions = SessionService(settings, commands)
    ptys = PtyService(settings)
    metrics = MetricsService(settings)
    services: list[Any] = [commands, sessions, ptys, metrics]

    routes: list[BaseRoute] = [Route("/ping", _ping, methods=["GET", "HEAD"])]
    for service in services:
        routes.extend(service.routes())
    routes.extend(file_routes(settings))
    for ext in extensions:
        routes.extend(ext.routes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for service in services:
            await service.startup()
        started: list[Extension] = []
        try:
            for ext in extensions:
                await ext.startup()
                started.append(ext)
            yield
        finally:
            for ext in reversed(started):
                try:
                    await ext.shutdown()
                except Exception:  # noqa: BLE001 - keep shutting the rest down
                    log.exception("extension shutdown failed")
            for service in reversed(services):
                try:
                    await service.shutdown()
                except Exception:  # noqa: BLE001
                    log.exception("service shutdown failed")

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            SandlotError: _sandlot_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.state.settings = settings
    app.state.commands = commands
    app.state.sessions = sessions
    app.state.ptys = ptys
    app.add_middleware(TokenAuth, settings=settings)
    return app
