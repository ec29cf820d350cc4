"""The console's routes: the page shell, its static assets, and sign-in/sign-out.

Everything else the page shows comes from the ``/v1`` API, called with the session cookie.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

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
_CSP = (
    # The page runs its own inlined entry script (allowed by its hash) and loads further
    # scripts and styles from this server only; xterm.js styles its cells inline.
    "default-src 'self'; script-src 'self' {script_hash}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".txt": "text/plain; charset=utf-8"}
# Smaller than this, gzip saves less than its own framing and time.
_GZIP_MIN_BYTES = 1024


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None  # compressed once at start (None: not worth it)


def _load_assets() -> dict[str, Asset]:
    """The bundle, read and compressed once. Served from memory rather than by Starlette's
    StaticFiles: these few files never change while the server runs, and StaticFiles stats and
    reads each through a worker thread per request, which cost 100+ ms per file on a busy
    host."""
    if not STATIC_DIR.is_dir():
        return {}
    found = {}
    for p in STATIC_DIR.rglob("*"):
        if p.is_file() and p.suffix in _MEDIA_TYPES:
            body = p.read_bytes()
            packed = gzip.compress(body, 9, mtime=0) if len(body) >= _GZIP_MIN_BYTES else None
            found[p.relative_to(STATIC_DIR).as_posix()] = Asset(body, packed)
    return found


def _accepts_gzip(request: Request) -> bool:
    return "gzip" in request.headers.get("accept-encoding", "").lower()


@dataclass(frozen=True)
class Page:
    """The page shell's fixed parts: the entry script and stylesheet are inlined, so the first
    view needs no request besides the page itself (and its API call)."""

    head: str  # up to the per-request meta tags
    boot: str  # after them: the script that sends the list's API call early (boot.ts)
    body: str  # the rest
    csp: str


def _inline_safe(text: str, tag: str) -> bool:
    return f"</{tag}" not in text.lower()


def _page(assets: dict[str, Asset]) -> Page:
    js = assets.get("console.js")
    css = assets.get("console.css")
    js_text = js.body.decode() if js else ""
    css_text = css.body.decode() if css else ""
    vendor_css = sorted(n for n in assets if n.startswith("vendor-") and n.endswith(".css"))
    vendor_meta = (f'<meta name="sandlot-vendor-css" content="/console/static/{vendor_css[0]}">\n'
                   if vendor_css else "")
    if css_text and _inline_safe(css_text, "style"):
        style = f"<style>{css_text}</style>\n"
    else:
        style = f'<link rel="stylesheet" href="/console/static/console.css?v={_version(css)}">\n'
    hashes: list[str] = []
    if js_text and _inline_safe(js_text, "script"):
        script = f'<script type="module">{js_text}</script>\n'
        hashes.append(_csp_hash(js_text))
    else:
        script = f'<script type="module" src="/console/static/console.js?v={_version(js)}">' \
                 "</script>\n"
    boot_text = assets["boot.js"].body.decode() if "boot.js" in assets else ""
    boot = ""
    if boot_text and _inline_safe(boot_text, "script"):
        boot = f"<script>{boot_text}</script>\n"
        hashes.append(_csp_hash(boot_text))
    head = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
"""
    body = f"""{vendor_meta}<link rel="icon" href="data:,">
<title>sandlot console</title>
{style}</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top"><a class="brand" href="#/">sandlot</a><nav id="nav" aria-label="Account"></nav>
</header>
<main id="main" tabindex="-1"><p>Loading the console…</p></main>
<div id="toast" role="status" aria-live="polite"></div>
<noscript>The sandlot console needs JavaScript.</noscript>
{script}</body>
</html>
"""
    csp = _CSP.format(script_hash=" ".join(hashes)).replace("'self' ;", "'self';")
    return Page(head, boot, body, csp)


def _csp_hash(script: str) -> str:
    """A CSP source allowing exactly this inline script."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def _version(asset: Asset | None) -> str:
    """A short hash of an entry file, so browsers never run a stale one after an upgrade."""
    return hashlib.sha256(asset.body if asset else b"").hexdigest()[:12]


def _shell(page: Page, csrf: str, execd_port: int) -> str:
    return (f'{page.head}<meta name="sandlot-csrf" content="{html.escape(csrf)}">\n'
            f'<meta name="sandlot-execd-port" content="{execd_port}">\n{page.boot}{page.body}')


def build_router(cfg: Config, sessions: SessionStore) -> APIRouter:
    router = APIRouter()
    assets = _load_assets()
    page = _page(assets)
    page_headers = {
        "Content-Security-Policy": page.csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
        "Vary": "Accept-Encoding",
    }

    @router.get("/console", include_in_schema=False)
    @router.get("/console/", include_in_schema=False)
    async def shell(request: Request) -> Response:
        session = await sessions.get(cookie_value(request.scope))
        body = _shell(page, session.csrf if session else "", cfg.execd.port).encode()
        headers = dict(page_headers)
        if _accepts_gzip(request):
            body = gzip.compress(body, 6)
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type="text/html; charset=utf-8", headers=headers)

    @router.get("/console/static/{path:path}", include_in_schema=False)
    async def asset(request: Request, path: str) -> Response:
        found = assets.get(path)
        if found is None:
            return JSONResponse({"code": "NOT_FOUND", "message": f"no console asset {path!r}"},
                                status_code=404)
        # Entry files are requested with ?v=<hash>, the others carry a hash in their name:
        # a URL's content never changes, so browsers may keep it.
        headers = {"Cache-Control": "public, max-age=31536000, immutable",
                   "X-Content-Type-Options": "nosniff", "Vary": "Accept-Encoding"}
        body = found.body
        if found.gzipped is not None and _accepts_gzip(request):
            body = found.gzipped
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=_MEDIA_TYPES[Path(path).suffix], headers=headers)

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
