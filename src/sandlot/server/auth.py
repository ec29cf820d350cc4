"""API-key gate (``OPEN-SANDBOX-API-KEY``) and request ids, as pure ASGI middleware.

Pure ASGI rather than ``BaseHTTPMiddleware`` so streamed proxy responses (SSE) and
WebSockets pass through untouched.
"""

from __future__ import annotations

import json
import secrets
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandlot.server import codes

API_KEY_HEADER = b"open-sandbox-api-key"
REQUEST_ID_HEADER = b"x-request-id"
# Reachable without a key, as on the reference server (liveness probes, version checks).
PUBLIC_PATHS = frozenset({"/health", "/version"})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None

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

        if self.api_key is not None and scope["path"] not in PUBLIC_PATHS:
            given = headers.get(API_KEY_HEADER)
            if not given or not secrets.compare_digest(given, self.api_key):
                # The reference's codes: an empty header counts as missing.
                code, message = (
                    (
                        codes.MISSING_API_KEY,
                        "No credentials: send the API key in the OPEN-SANDBOX-API-KEY header.",
                    )
                    if not given
                    else (
                        codes.INVALID_API_KEY,
                        "The API key in OPEN-SANDBOX-API-KEY is not valid for this server.",
                    )
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
                return
        await self.app(scope, receive, send_with_id)
