"""Browser sessions of the console: a random id in an HttpOnly, SameSite=Strict cookie names a
server-side record holding the API key the user signed in with and a CSRF token.

Why the key is kept server-side: every authorisation decision stays the API-key middleware's
(``server.auth``); a session only supplies the key, so a session never reaches more than its key
does, and a revoked key ends its sessions on the next request. Records live in memory only: a
server restart signs everyone out, and nothing secret is written to disk.

CSRF: besides SameSite=Strict, every cookie-authenticated HTTP request must carry the session's
token in ``X-Sandlot-CSRF`` (a header a cross-site page cannot set without a CORS preflight this
server never answers), and every WebSocket must come from this server's own origin and carry the
token in the ``sandlot_csrf`` query parameter. Both are removed before the request goes on, and
the cookie too, so neither travels through the proxy into a sandbox.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from starlette.types import Scope

COOKIE_NAME = "sandlot_console"
CSRF_HEADER = b"x-sandlot-csrf"
CSRF_QUERY = "sandlot_csrf"
MAX_SESSIONS = 10_000
# Where a session cookie is honoured: the lifecycle API (and execd through its proxy) and the
# console's own API. Unversioned aliases of /v1 are left to API-key clients.
SESSION_PATHS = ("/v1/", "/console/api/")
# The scope key under which an authenticated request carries its session id (for sign-out).
SCOPE_KEY = "sandlot.console_session"


class SessionRejected(Exception):
    """A console cookie was sent but cannot authenticate this request."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    api_key: str
    csrf: str
    created: float
    last_used: float


def cookie_value(scope: Scope) -> str | None:
    """The console cookie of a request, if it sent one."""
    for name, value in scope.get("headers") or []:
        if name != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, val = part.strip().partition("=")
            if key == COOKIE_NAME and val:
                return val
    return None


def _strip_cookie(raw: bytes) -> bytes:
    parts = [p.strip() for p in raw.decode("latin-1").split(";")]
    return "; ".join(p for p in parts if p and p.partition("=")[0] != COOKIE_NAME).encode(
        "latin-1"
    )


def _same_origin(headers: dict[bytes, bytes], scope: Scope) -> bool:
    origin = headers.get(b"origin")
    host = headers.get(b"host")
    if not origin or not host:
        return False
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    return origin.decode("latin-1") == f"{scheme}://{host.decode('latin-1')}"


class SessionStore:
    def __init__(self, idle_seconds: float, lifetime_seconds: float) -> None:
        """``idle_seconds``: signed-in time without use; ``lifetime_seconds``: the absolute
        limit of one sign-in (``[console]`` in the config)."""
        self.idle_seconds = idle_seconds
        self.lifetime_seconds = lifetime_seconds
        self._sessions: dict[str, Session] = {}

    def create(self, api_key: str) -> tuple[str, Session]:
        """A new session (a new id on every sign-in, so no fixation)."""
        self._expire()
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_used)
            del self._sessions[oldest]
        now = time.monotonic()
        sid = secrets.token_urlsafe(32)
        session = Session(api_key, secrets.token_urlsafe(32), now, now)
        self._sessions[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        now = time.monotonic()
        if (now - session.last_used > self.idle_seconds
                or now - session.created > self.lifetime_seconds):
            del self._sessions[sid]
            return None
        session.last_used = now
        return session

    def delete(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)

    def _expire(self) -> None:
        for sid in list(self._sessions):
            self.get(sid)

    def authenticate(self, scope: Scope) -> tuple[Scope, bytes] | None:
        """For a request carrying the console cookie: a copy of ``scope`` without the cookie and
        the CSRF token, and the API key to check it with. None when there is no cookie or the
        path does not take sessions; ``SessionRejected`` when the cookie cannot be used."""
        sid = cookie_value(scope)
        if sid is None or not scope["path"].startswith(SESSION_PATHS):
            return None
        session = self.get(sid)
        if session is None:
            raise SessionRejected(
                "SESSION_EXPIRED", "The console session has ended; sign in again."
            )
        raw_headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        headers = dict(raw_headers)
        query = scope.get("query_string", b"")
        if scope["type"] == "websocket":
            pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
            given = next((v for k, v in pairs if k == CSRF_QUERY), "")
            if not _same_origin(headers, scope):
                raise SessionRejected(
                    "CSRF_CHECK_FAILED", "A console WebSocket must come from the console's origin."
                )
            query = urlencode([(k, v) for k, v in pairs if k != CSRF_QUERY]).encode("latin-1")
        else:
            given = headers.get(CSRF_HEADER, b"").decode("latin-1")
        if not given or not secrets.compare_digest(given, session.csrf):
            raise SessionRejected(
                "CSRF_CHECK_FAILED",
                "A console request must carry its session's CSRF token "
                "(X-Sandlot-CSRF header, or sandlot_csrf for WebSockets).",
            )
        kept: list[tuple[bytes, bytes]] = []
        for name, value in raw_headers:
            if name == CSRF_HEADER:
                continue
            if name == b"cookie":
                value = _strip_cookie(value)
                if not value:
                    continue
            kept.append((name, value))
        new_scope = {**scope, "headers": kept, "query_string": query, SCOPE_KEY: sid}
        return new_scope, session.api_key.encode()
