"""The console's browser sessions at the API-key gate: sign-in checks the key, the cookie is
HttpOnly/SameSite=Strict, every cookie request needs the CSRF token (WebSockets: same origin and
the token in the query), and neither cookie nor token travels through the proxy into a sandbox.
API-key clients are unaffected."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from sandlot.console.sessions import COOKIE_NAME, SessionStore
from sandlot.server.tenancy.keys import digest
from tests.server.conftest import API_KEY, Harness
from tests.tenants.tenants_setup import KEY_A, KEY_A2, KEY_B, tenants_toml, write_tenants

pytestmark = pytest.mark.fake_only


async def running(harness: Harness, client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/sandboxes", json={"image": {"uri": "python:3.12"},
                                                 "entrypoint": ["sleep", "infinity"]})
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    return str(sid)


@asynccontextmanager
async def signed_in(harness: Harness) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client acting as a browser: it signed in and holds the session cookie."""
    async with httpx.AsyncClient(base_url=harness.base, timeout=10) as browser:
        r = await browser.post("/console/api/session", headers={"OPEN-SANDBOX-API-KEY": API_KEY})
        assert r.status_code == 200, r.text
        yield browser, r.json()["csrfToken"]


async def test_page_shell_and_assets_need_no_key(harness: Harness) -> None:
    async with httpx.AsyncClient(base_url=harness.base) as anon:
        page = await anon.get("/console")
        assert page.status_code == 200
        assert 'name="sandlot-csrf" content=""' in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        js = await anon.get("/console/static/console.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        # The entry script is inlined and allowed by its hash (no 'unsafe-inline' for scripts);
        # xterm.js and uPlot are not in it (their chunks load with their tabs).
        inline = re.search(r'<script type="module">(.*?)</script>', page.text, re.S)
        assert inline is not None and inline.group(1) == js.text
        script_hash = base64.b64encode(hashlib.sha256(js.content).digest()).decode()
        csp = page.headers["content-security-policy"]
        assert f"'sha256-{script_hash}'" in csp and "unsafe-inline'; style" not in csp
        boot = re.search(r"<script>(.*?)</script>", page.text, re.S)
        assert boot is not None  # the list's early API call
        boot_hash = base64.b64encode(hashlib.sha256(boot.group(1).encode()).digest()).decode()
        assert f"'sha256-{boot_hash}'" in csp
        assert len(js.content) < 100_000  # xterm.js alone is ~340 KB
        for lib in ("xterm", "uplot"):
            chunk = re.search(rf'import\("(/console/static/chunks/vendor-{lib}-[^"]+\.js)"\)',
                              js.text)
            assert chunk is not None, lib
            assert len((await anon.get(chunk.group(1))).content) > 20_000
        vendor = re.search(r'name="sandlot-vendor-css" content="([^"]+)"', page.text)
        assert vendor is not None and (await anon.get(vendor.group(1))).status_code == 200
        # gzip when the client takes it (httpx sends Accept-Encoding: gzip and decodes)
        assert page.headers["content-encoding"] == "gzip"
        assert js.headers["content-encoding"] == "gzip" and "Accept-Encoding" in js.headers["vary"]
        plain = await anon.get("/console/static/console.js",
                               headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.content == js.content
        # Anything else under /console is not public.
        assert (await anon.get("/console/api/session")).status_code == 401


async def test_sign_in_checks_the_key_and_sets_a_strict_httponly_cookie(harness: Harness) -> None:
    async with httpx.AsyncClient(base_url=harness.base) as anon:
        r = await anon.post("/console/api/session", headers={"OPEN-SANDBOX-API-KEY": "wrong"})
        assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
        assert "set-cookie" not in r.headers
        r = await anon.post("/console/api/session")
        assert r.status_code == 401 and r.json()["code"] == "MISSING_API_KEY"
    async with signed_in(harness) as (browser, csrf):
        r = await browser.post("/console/api/session", headers={"OPEN-SANDBOX-API-KEY": API_KEY})
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE_NAME}=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        # A second sign-in is a new session (no fixation) with its own token.
        assert r.json()["csrfToken"] != csrf
        # The page shell of a signed-in browser carries its CSRF token.
        page = await browser.get("/console")
        token = re.search(r'name="sandlot-csrf" content="([^"]+)"', page.text)
        assert token is not None and token.group(1) == r.json()["csrfToken"]


async def test_cookie_requests_need_the_csrf_token(harness: Harness) -> None:
    async with signed_in(harness) as (browser, csrf):
        r = await browser.get("/v1/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == "CSRF_CHECK_FAILED"
        r = await browser.post("/v1/sandboxes", json={"image": {"uri": "python:3.12"}},
                               headers={"X-Sandlot-CSRF": "not-the-token"})
        assert r.status_code == 401 and r.json()["code"] == "CSRF_CHECK_FAILED"
        assert harness.service.list(None, None, 1, 20).total_items == 0  # nothing was created
        r = await browser.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 200 and r.json()["items"] == []
        # Sessions are honoured on /v1 and the console's API only, not on unversioned aliases.
        r = await browser.get("/sandboxes", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 401 and r.json()["code"] == "MISSING_API_KEY"
        # Sign-out ends the session on the server (and asks the browser to drop the cookie).
        old = browser.cookies[COOKIE_NAME]
        r = await browser.delete("/console/api/session", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 204 and COOKIE_NAME not in browser.cookies
        browser.cookies.set(COOKIE_NAME, old)
        r = await browser.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 401 and r.json()["code"] == "SESSION_EXPIRED"


async def test_api_key_clients_are_unchanged(harness: Harness, client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/sandboxes")).status_code == 200
    async with harness.client(key="wrong") as bad:
        r = await bad.get("/v1/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
    # A forged cookie is not a key.
    async with httpx.AsyncClient(base_url=harness.base,
                                 cookies={COOKIE_NAME: "forged"}) as forged:
        r = await forged.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": "x"})
        assert r.status_code == 401 and r.json()["code"] == "SESSION_EXPIRED"


async def test_cookie_and_token_never_reach_the_sandbox(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    async with signed_in(harness) as (browser, csrf):
        browser.cookies.set("app", "kept")
        r = await browser.get(f"/v1/sandboxes/{sid}/proxy/44772/echo",
                              headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 200, r.text
        seen = r.json()["headers"]
        assert COOKIE_NAME not in seen.get("cookie", "")
        assert seen.get("cookie") == "app=kept"
        assert "x-sandlot-csrf" not in seen and "open-sandbox-api-key" not in seen


async def test_websocket_needs_same_origin_and_token(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    async with signed_in(harness) as (browser, csrf):
        cookie = f"{COOKIE_NAME}={browser.cookies[COOKIE_NAME]}"
    host = f"127.0.0.1:{harness.cfg.server.port}"
    url = f"ws://{host}/v1/sandboxes/{sid}/proxy/44772/ws"
    for origin, query in (("http://evil.example", csrf), (f"http://{host}", "wrong")):
        with pytest.raises(InvalidStatus):
            async with ws_connect(f"{url}?sandlot_csrf={query}", origin=origin,  # type: ignore[arg-type]
                                  additional_headers={"Cookie": cookie}) as ws:
                await ws.send("hi")
                await ws.recv()
    async with ws_connect(f"{url}?sandlot_csrf={csrf}", origin=f"http://{host}",  # type: ignore[arg-type]
                          additional_headers={"Cookie": cookie}) as ws:
        await ws.send("hi")
        assert await ws.recv() == "echo:hi"


async def test_console_can_be_turned_off(tmp_path: Path) -> None:
    off = Harness(tmp_path)
    off.cfg.console.enabled = False
    await off.start()
    try:
        async with httpx.AsyncClient(base_url=off.base, cookies={COOKIE_NAME: "x"}) as anon:
            assert (await anon.get("/console")).status_code == 404
            r = await anon.post("/console/api/session", headers={"OPEN-SANDBOX-API-KEY": API_KEY})
            assert r.status_code == 404 and "set-cookie" not in r.headers
            # A cookie is not looked at: the request needs the key like any other.
            r = await anon.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": "x"})
            assert r.status_code == 401 and r.json()["code"] == "MISSING_API_KEY"
    finally:
        await off.destroy()


async def test_sessions_end_when_idle_or_too_old(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    store = SessionStore(idle_seconds=60, lifetime_seconds=300)
    sid, _ = await store.create(digest("key"))
    clock[0] += 59
    assert await store.get(sid) is not None  # used: the idle timer restarts
    clock[0] += 59
    assert await store.get(sid) is not None
    clock[0] += 61
    assert await store.get(sid) is None  # idle too long
    sid, _ = await store.create(digest("key"))
    for _ in range(7):
        clock[0] += 50
        await store.get(sid)
    assert await store.get(sid) is None  # past its lifetime although in use


async def test_a_session_survives_a_restart_and_only_digests_are_stored(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    async with signed_in(harness) as (browser, csrf):
        cookie = browser.cookies[COOKIE_NAME]
        await harness.stop()
        await harness.start()
        r = await browser.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 200, r.text
        assert sid in [s["id"] for s in r.json()["items"]]
        # the CSRF check holds after the restart too, and the page gets the same token
        r = await browser.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": "not-the-token"})
        assert r.status_code == 401 and r.json()["code"] == "CSRF_CHECK_FAILED"
        page = (await browser.get("/console")).text
        assert f'name="sandlot-csrf" content="{csrf}"' in page
        # the database holds neither the session id, nor the key, nor the CSRF token
        db = b"".join(p.read_bytes() for p in harness.cfg.data_dir.glob("sandlot.db*"))
        for secret in (cookie, API_KEY, csrf):
            assert secret.encode() not in db
        assert hashlib.sha256(cookie.encode()).hexdigest().encode() in db
        # signing out after the restart ends it for good, restarts included
        r = await browser.delete("/console/api/session", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 204
        await harness.stop()
        await harness.start()
        browser.cookies.set(COOKIE_NAME, cookie)
        r = await browser.get("/v1/sandboxes", headers={"X-Sandlot-CSRF": csrf})
        assert r.status_code == 401 and r.json()["code"] == "SESSION_EXPIRED"


async def test_a_tenants_session_acts_as_that_tenant(tmp_path: Path) -> None:
    """A session signs in with a tenant's key: it sees that tenant's sandboxes only, others'
    are unknown (404), and retiring the key (tenants file edit, no restart) ends the session."""
    h = Harness(tmp_path)
    path = tmp_path / "tenants.toml"
    write_tenants(path, tenants_toml())
    h.cfg.tenants.file = str(path)
    await h.start()
    try:
        async with h.client(KEY_A) as a, h.client(KEY_B) as b:
            body = {"image": {"uri": "python:3.12"}, "entrypoint": ["sleep", "infinity"],
                    "resourceLimits": {"cpu": "500m", "memory": "256Mi"}}
            own = (await a.post("/v1/sandboxes", json=body)).json()["id"]
            other = (await b.post("/v1/sandboxes", json=body)).json()["id"]
            async with httpx.AsyncClient(base_url=h.base, timeout=10) as browser:
                r = await browser.post("/console/api/session",
                                       headers={"OPEN-SANDBOX-API-KEY": KEY_A})
                csrf = {"X-Sandlot-CSRF": r.json()["csrfToken"]}
                listed = (await browser.get("/v1/sandboxes", headers=csrf)).json()["items"]
                assert [s["id"] for s in listed] == [own]
                assert (await browser.get(f"/v1/sandboxes/{other}", headers=csrf)
                        ).status_code == 404
                r = await browser.delete(f"/v1/sandboxes/{other}", headers=csrf)
                assert r.status_code == 404
                assert (await b.get(f"/v1/sandboxes/{other}")).status_code == 200
                write_tenants(path, tenants_toml([KEY_A2]))  # team-a's key retired
                r = await browser.get("/v1/sandboxes", headers=csrf)
                assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
    finally:
        await h.destroy()
