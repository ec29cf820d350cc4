"""Authentication gate and request ids, as pure ASGI middleware.

The web console's browser sessions enter here and nowhere else: a request with a console
cookie and no key header is given the digest of the key its session signed in with
(``console.sessions``, which also checks the CSRF token and strips cookie and token), and then
faces the same authenticators as every client.

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

from sandlot.console.sessions import SessionRejected, SessionStore
from sandlot.server import codes
from sandlot.server.diagnostic_downloads import PATH_PREFIX as DOWNLOADS_PREFIX
from sandlot.server.tenancy.authn import API_KEY_HEADER, SESSION_KEY_DIGEST, Authenticator
from sandlot.server.tenancy.principal import ADMIN, ANONYMOUS, Principal, acting_as

REQUEST_ID_HEADER = b"x-request-id"
# Reachable without a key, as on the reference server (liveness probes, version checks).
PUBLIC_PATHS = frozenset({"/health", "/version"})
# The console's page shell and its static assets hold no data: its sign-in form is among them.
# Diagnostics download URLs carry their own 256-bit token (``diagnostic_downloads``).
PUBLIC_PREFIXES = ("/console/static/", DOWNLOADS_PREFIX)
PUBLIC_PAGES = frozenset({"/console", "/console/"})


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path in PUBLIC_PAGES or path.startswith(PUBLIC_PREFIXES)


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        authenticators: Sequence[Authenticator],
        extra_public: frozenset[str] = frozenset(),
        sessions: SessionStore | None = None,
    ):
        self.app = app
        self.authenticators = authenticators  # read per request: plug-ins may be added later
        self.public = PUBLIC_PATHS | extra_public  # e.g. /metrics with [metrics] open
        # The console's browser sessions: a request without the key header but with a console
        # cookie (and its CSRF token) is given the key that session signed in with.
        self.sessions = sessions

    def _is_public(self, path: str) -> bool:
        return path in self.public or is_public(path)

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

        given = headers.get(API_KEY_HEADER)
        if self.sessions is not None and not given:
            try:
                resolved = await self.sessions.authenticate(scope)
            except SessionRejected as exc:
                await _refuse(scope, send, send_with_id, (exc.code, exc.message))
                return
            if resolved is not None:
                # The session's key digest goes in the scope: the same authenticators decide.
                scope, key_digest = resolved
                scope[SESSION_KEY_DIGEST] = key_digest
                given = b"(the console session's key)"  # a retired key: INVALID_API_KEY
        principal = await self._principal(scope)
        if principal is None and not self._is_public(scope["path"]):
            await _refuse(scope, send, send_with_id, _key_problem(given))
            return
        with acting_as(principal or ANONYMOUS):  # public paths: a principal that sees nothing
            await self.app(scope, receive, send_with_id)


def _key_problem(given: bytes | None) -> tuple[str, str]:
    # The reference's codes: an empty header counts as missing.
    if not given:
        return (codes.MISSING_API_KEY,
                "No credentials: send the API key in the OPEN-SANDBOX-API-KEY header.")
    return (codes.INVALID_API_KEY,
            "The API key in OPEN-SANDBOX-API-KEY is not valid for this server.")


async def _refuse(
    scope: Scope, send: Send, send_with_id: Send, problem: tuple[str, str]
) -> None:
    code, message = problem
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
