"""The console's routes: the page shell, its static assets, and sign-in/sign-out.

Everything else the page shows comes from the ``/v1`` API, called with the session cookie.
"""

from __future__ import annotations

import hashlib
import html
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from sandlot.config import Config
from sandlot.console.sessions import (
    COOKIE_NAME,
    SCOPE_KEY,
    SessionStore,
    cookie_value,
)
from sandlot.server.store.console_sessions import ConsoleSessionStore
from sandlot.server.store.sandboxes import SandboxStore
from sandlot.server.tenancy.keys import digest

STATIC_DIR = Path(str(resources.files("sandlot.console") / "static"))
_SECURITY_HEADERS = {
    # The page loads its own script and style only; xterm.js styles its cells inline.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".txt": "text/plain; charset=utf-8"}


def _load_assets() -> dict[str, bytes]:
    """The bundle, read once. Served from memory rather than by Starlette's StaticFiles: these
    few small files never change while the server runs, and StaticFiles stats and reads each
    through a worker thread per request, which cost 100+ ms per file on a busy host."""
    if not STATIC_DIR.is_dir():
        return {}
    return {
        p.relative_to(STATIC_DIR).as_posix(): p.read_bytes()
        for p in STATIC_DIR.rglob("*")
        if p.is_file() and p.suffix in _MEDIA_TYPES
    }


def _asset_version() -> str:
    """A short hash of the bundle, so browsers never run a stale one after an upgrade."""
    digest = hashlib.sha256()
    for name in ("console.js", "console.css"):
        path = STATIC_DIR / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _preloads() -> str:
    """modulepreload links for the shared chunks the entry script imports, so the browser
    fetches them alongside it rather than after it (the tab-only chunks are left out)."""
    chunks = sorted((STATIC_DIR / "chunks").glob("chunk-*.js"))
    return "".join(
        f'<link rel="modulepreload" href="/console/static/chunks/{c.name}">\n' for c in chunks
    )


def _shell(csrf: str, execd_port: int, version: str, preloads: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="sandlot-csrf" content="{html.escape(csrf)}">
<meta name="sandlot-execd-port" content="{execd_port}">
<link rel="icon" href="data:,">
<title>sandlot console</title>
<link rel="stylesheet" href="/console/static/console.css?v={version}">
<link rel="modulepreload" href="/console/static/console.js?v={version}">
{preloads}</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top"><a class="brand" href="#/">sandlot</a><nav id="nav" aria-label="Account"></nav>
</header>
<main id="main" tabindex="-1"><p>Loading the console…</p></main>
<div id="toast" role="status" aria-live="polite"></div>
<noscript>The sandlot console needs JavaScript.</noscript>
<script type="module" src="/console/static/console.js?v={version}"></script>
</body>
</html>
"""


def build_router(cfg: Config, sessions: SessionStore) -> APIRouter:
    router = APIRouter()
    version = _asset_version()
    preloads = _preloads()

    @router.get("/console", include_in_schema=False)
    @router.get("/console/", include_in_schema=False)
    async def shell(request: Request) -> HTMLResponse:
        session = await sessions.get(cookie_value(request.scope))
        page = _shell(session.csrf if session else "", cfg.execd.port, version, preloads)
        return HTMLResponse(page, headers=_SECURITY_HEADERS)

    assets = _load_assets()

    @router.get("/console/static/{path:path}", include_in_schema=False)
    async def asset(path: str) -> Response:
        body = assets.get(path)
        if body is None:
            return JSONResponse({"code": "NOT_FOUND", "message": f"no console asset {path!r}"},
                                status_code=404)
        # Entry files are requested with ?v=<bundle hash> and chunk names carry their own
        # hash: a URL's content never changes, so browsers may keep it.
        return Response(body, media_type=_MEDIA_TYPES[Path(path).suffix], headers={
            "Cache-Control": "public, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff"})

    @router.post("/console/api/session", include_in_schema=False)
    async def sign_in(request: Request) -> JSONResponse:
        # The API-key middleware has already checked the key in the header: only a valid key
        # gets here (any key when the server runs with insecure_no_auth).
        key = request.headers.get("open-sandbox-api-key", "")
        sid, session = await sessions.create(digest(key))
        response = JSONResponse(
            {"csrfToken": session.csrf, "idleSeconds": sessions.idle_seconds,
             "lifetimeSeconds": sessions.lifetime_seconds},
            headers={"Cache-Control": "no-store"},
        )
        response.set_cookie(
            COOKIE_NAME, sid, max_age=int(sessions.lifetime_seconds), path="/", httponly=True,
            samesite="strict", secure=request.url.scheme == "https",
        )
        return response

    @router.delete("/console/api/session", include_in_schema=False)
    async def sign_out(request: Request) -> Response:
        # With a session, reached only with its CSRF token (the middleware's check), which also
        # took the cookie off the request and left the session id in the scope.
        await sessions.delete(request.scope.get(SCOPE_KEY))
        response = Response(status_code=204)
        response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
        return response

    return router


def install_console(app: FastAPI, cfg: Config) -> SessionStore | None:
    """Serve the console on ``app`` unless ``[console] enabled = false``; the returned sessions
    go to the API-key middleware (None: no console, so no cookie is ever honoured)."""
    if not cfg.console.enabled:
        return None
    sessions = SessionStore(cfg.console.session_idle_seconds, cfg.console.session_lifetime_seconds)
    app.include_router(build_router(cfg, sessions))
    app.state.console_sessions = sessions
    return sessions


async def open_sessions(app: FastAPI, store: SandboxStore) -> None:
    """Keep the console's sessions in the store (at start, once it is open)."""
    sessions: SessionStore | None = getattr(app.state, "console_sessions", None)
    if sessions is not None:
        await sessions.open(ConsoleSessionStore(store))
