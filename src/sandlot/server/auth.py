"""Authentication gate and request ids, as pure ASGI middleware.

Each request is resolved to a principal (a tenant or an administrator) by the first of
``authenticators`` that vouches for it (``tenancy.authn``: the API key, or one plugged in
later); the principal is set for the request's duration (``tenancy.principal``). No
authenticators (``--insecure-no-auth``): every request acts as the administrator.

Pure ASGI rather than ``BaseHTTPMiddleware`` so streamed proxy responses (SSE) and
WebSockets pass through untouched.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandlot.server import codes
from sandlot.server.tenancy.authn import API_KEY_HEADER, Authenticator
from sandlot.server.tenancy.principal import ADMIN, ANONYMOUS, Principal, acting_as

REQUEST_ID_HEADER = b"x-request-id"
# Reachable without a key, as on the reference server (liveness probes, version checks).
PUBLIC_PATHS = frozenset({"/health", "/version"})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, authenticators: Sequence[Authenticator],
                 extra_public: frozenset[str] = frozenset()):
        self.app = app
        self.authenticators = authenticators  # read per request: plug-ins may be added later
        self.public = PUBLIC_PATHS | extra_public  # e.g. /metrics with [metrics] open

    async def _principal(self, scope: Scope) -> Principal | None:
        if not self.authenticators:
            return ADMIN
        for authenticator in self.authenticators:
            principal = await authenticator.authenticate(scope)
            if principal is not None:
                return principal
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (REQUEST_ID_HEADER, request_id)]
            await send(message)

        principal = await self._principal(scope)
        if principal is None and scope["path"] not in self.public:
            await _refuse(scope, send, send_with_id, headers.get(API_KEY_HEADER))
            return
        with acting_as(principal or ANONYMOUS):  # public paths: a principal that sees nothing
            await self.app(scope, receive, send_with_id)


async def _refuse(scope: Scope, send: Send, send_with_id: Send, given: bytes | None) -> None:
    # The reference's codes: an empty header counts as missing.
    code, message = (
        (codes.MISSING_API_KEY,
         "No credentials: send the API key in the OPEN-SANDBOX-API-KEY header.")
        if not given
        else (codes.INVALID_API_KEY,
              "The API key in OPEN-SANDBOX-API-KEY is not valid for this server.")
    )
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message})
        return
    body = json.dumps({"code": code, "message": message}).encode()
    await send_with_id(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send_with_id({"type": "http.response.body", "body": body})
