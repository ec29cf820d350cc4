"""Authenticators: each turns a request (its ASGI scope) into a principal, or None.

The middleware (``sandlot.server.auth``) asks them in order; the first principal wins. The
API key one is built in; another (e.g. a console's session cookie) plugs in by being
appended to ``app.state.authenticators``, and may use ``ApiKeyAuthenticator.principal_for_key``
to sign a key in.
"""

from __future__ import annotations

from typing import Protocol

from starlette.types import Scope

from sandlot.server.tenancy.directory import TenantDirectory
from sandlot.server.tenancy.keys import digest
from sandlot.server.tenancy.principal import ADMIN, Principal

API_KEY_HEADER = b"open-sandbox-api-key"
# Set by the API-key middleware (never from the wire) when a console session vouched for a
# request: the digest of the key that session signed in with.
SESSION_KEY_DIGEST = "sandlot.session_key_digest"


class Authenticator(Protocol):
    async def authenticate(self, scope: Scope) -> Principal | None:
        """The request's principal, or None when this authenticator does not vouch for it."""
        ...


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value)
    return None


class ApiKeyAuthenticator:
    """``OPEN-SANDBOX-API-KEY``: ``[server] api_key`` is the administrator (and the default
    tenant); the tenants file adds tenant and admin keys. Only digests are kept."""

    def __init__(self, server_key: str | None, directory: TenantDirectory | None) -> None:
        self._server_digest = digest(server_key) if server_key else None
        self.directory = directory

    def principal_for_key(self, key: str | bytes) -> Principal | None:
        if not key:
            return None
        return self.principal_for_digest(digest(key))

    def principal_for_digest(self, d: str) -> Principal | None:
        if self._server_digest is not None and d == self._server_digest:
            return ADMIN
        if self.directory is not None:
            return self.directory.lookup(d)
        return None

    async def authenticate(self, scope: Scope) -> Principal | None:
        given = header(scope, API_KEY_HEADER)
        if given:
            return self.principal_for_key(given)
        session_digest = scope.get(SESSION_KEY_DIGEST)
        return self.principal_for_digest(session_digest) if session_digest else None
