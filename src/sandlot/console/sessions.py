"""Browser sessions of the console: a random id in an HttpOnly, SameSite=Strict cookie names a
server-side record holding the digest of the API key the user signed in with.

Why a key digest is kept server-side: every authorisation decision stays the authenticators'
(``server.tenancy.authn``, which look keys up by digest anyway); a session only supplies the
digest, so a session never reaches more than its key does, and a revoked key ends its sessions
on the next request.

Records are cached in memory and kept in the store (``console_sessions``), so a restart signs
nobody out and servers sharing a PostgreSQL database share the sessions. Only digests are
written: of the session id (a stolen database cannot be turned into a cookie) and of the key.
The CSRF token is derived from the session id (a different digest), so it is never stored.

CSRF: besides SameSite=Strict, every cookie-authenticated HTTP request must carry the session's
token in ``X-Sandlot-CSRF`` (a header a cross-site page cannot set without a CORS preflight this
server never answers), and every WebSocket must come from this server's own origin and carry the
token in the ``sandlot_csrf`` query parameter. Both are removed before the request goes on, and
the cookie too, so neither travels through the proxy into a sandbox.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from starlette.types import Scope

from sandlot.server.store.console_sessions import ConsoleSessionStore, SessionRow

COOKIE_NAME = "sandlot_console"
CSRF_HEADER = b"x-sandlot-csrf"
CSRF_QUERY = "sandlot_csrf"
MAX_SESSIONS = 10_000
# Where a session cookie is honoured: the lifecycle API (and execd through its proxy) and the
# console's own API. Unversioned aliases of /v1 are left to API-key clients.
SESSION_PATHS = ("/v1/", "/console/api/")
# The scope key under which an authenticated request carries its session id (for sign-out).
SCOPE_KEY = "sandlot.console_session"
_TOUCH_SECONDS = 60.0


class SessionRejected(Exception):
    """A console cookie was sent but cannot authenticate this request."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    key_digest: str  # SHA-256 of the API key signed in with (``tenancy.keys.digest``)
    csrf: str
    created: float  # UTC epoch seconds: they survive a restart
    last_used: float
    saved_use: float  # the last_used the store holds (written at most every _TOUCH_SECONDS)


def _id_digest(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def _csrf_of(sid: str) -> str:
    """The session's CSRF token: a digest of its id under another label, so knowing the token
    (the page does) reveals neither the id nor the stored digest."""
    return hashlib.sha256(b"sandlot-console-csrf\0" + sid.encode()).hexdigest()


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
        limit of one sign-in (``[console]`` in the config). In memory only until ``open``."""
        self.idle_seconds = idle_seconds
        self.lifetime_seconds = lifetime_seconds
        self._sessions: dict[str, Session] = {}  # by id digest
        self._db: ConsoleSessionStore | None = None
        # How stale the stored last use may get: a restart may shorten an idle session's
        # remaining time by this much at most, and a busy session writes once a minute.
        self._touch_seconds = min(_TOUCH_SECONDS, idle_seconds / 10)

    async def open(self, db: ConsoleSessionStore) -> None:
        """Keep sessions in ``db`` from now on (forgetting those that expired meanwhile)."""
        self._db = db
        now = time.time()
        await db.prune(now - self.idle_seconds, now - self.lifetime_seconds)

    async def create(self, key_digest: str) -> tuple[str, Session]:
        """A new session (a new id on every sign-in, so no fixation)."""
        await self._expire()
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_used)
            await self._forget(oldest)
        now = time.time()
        sid = secrets.token_urlsafe(32)
        session = Session(key_digest, _csrf_of(sid), now, now, now)
        self._sessions[_id_digest(sid)] = session
        if self._db is not None:
            await self._db.add(SessionRow(_id_digest(sid), key_digest, now, now))
        return sid, session

    async def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        digest = _id_digest(sid)
        session = self._sessions.get(digest)
        if session is None and self._db is not None:
            # Made before a restart, or by another server sharing the database.
            row = await self._db.get(digest)
            if row is not None:
                session = Session(row.key_digest, _csrf_of(sid), row.created_at,
                                  row.last_used_at, row.last_used_at)
                self._sessions[digest] = session
        if session is None:
            return None
        return await self._use(digest, session)

    async def _use(self, digest: str, session: Session) -> Session | None:
        now = time.time()
        if self._expired(session, now):
            await self._forget(digest)
            return None
        session.last_used = now
        if self._db is not None and now - session.saved_use >= self._touch_seconds:
            session.saved_use = now
            await self._db.touch(digest, now)
        return session

    async def delete(self, sid: str | None) -> None:
        if sid:
            await self._forget(_id_digest(sid))

    async def _forget(self, digest: str) -> None:
        self._sessions.pop(digest, None)
        if self._db is not None:
            await self._db.delete(digest)

    def _expired(self, session: Session, now: float) -> bool:
        return (now - session.last_used > self.idle_seconds
                or now - session.created > self.lifetime_seconds)

    async def _expire(self) -> None:
        now = time.time()
        for digest, session in list(self._sessions.items()):
            if self._expired(session, now):
                self._sessions.pop(digest, None)
        if self._db is not None:  # also those only the store knows (made before a restart)
            await self._db.prune(now - self.idle_seconds, now - self.lifetime_seconds)

    async def authenticate(self, scope: Scope) -> tuple[Scope, str] | None:
        """For a request carrying the console cookie: a copy of ``scope`` without the cookie and
        the CSRF token, and the digest of the API key to check it with. None when there is no
        cookie or the path does not take sessions; ``SessionRejected`` when the cookie cannot be
        used."""
        sid = cookie_value(scope)
        if sid is None or not scope["path"].startswith(SESSION_PATHS):
            return None
        session = await self.get(sid)
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
        return new_scope, session.key_digest
