"""Two tenants and the admin through the lifecycle API (raw HTTP), on SQLite and PostgreSQL.

The real app and store over the fake runtime (in-process): every sandbox route answers
another tenant's sandbox exactly as an unknown id (404, same body); quotas refuse a create
with 429 and leave nothing in the store or the runtime; the admin key sees all; keys rotate
by editing the file.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from sandlot.server.store import SandboxStore
from tests.server.conftest import API_KEY, Harness
from tests.tenants.tenants_setup import KEY_A, KEY_A2, KEY_B, tenants_toml, write_tenants

BODY = {
    "image": {"uri": "python:3.12"},
    "entrypoint": ["tail", "-f", "/dev/null"],
    "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
    "timeout": 600,
}


@pytest.fixture(params=["sqlite", "postgresql"])
async def tenant_harness(request: pytest.FixtureRequest, tmp_path: Path
                         ) -> AsyncIterator[Harness]:
    h = Harness(tmp_path)
    if request.param == "postgresql":
        h.cfg.store.url = request.getfixturevalue("pg_url")
    path = tmp_path / "tenants.toml"
    write_tenants(path, tenants_toml())
    h.cfg.tenants.file = str(path)
    await h.start()
    try:
        yield h
    finally:
        await h.destroy()
        shutil.rmtree(h.short_root, ignore_errors=True)


async def create(c: httpx.AsyncClient, **limits: str) -> dict:
    r = await c.post("/v1/sandboxes", json={**BODY, "resourceLimits": {
        **BODY["resourceLimits"], **limits}})  # type: ignore[dict-item]
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def same_as_unknown(r: httpx.Response, unknown: httpx.Response, sid: str, other: str) -> None:
    """``r`` (about ``sid``) is indistinguishable from ``unknown`` (about ``other``)."""
    assert r.status_code == unknown.status_code == 404, (r.status_code, r.text)
    assert r.text.replace(sid, "ID") == unknown.text.replace(other, "ID")


# Every route that takes a sandbox id: (method, path suffix, body).
SANDBOX_ROUTES = [
    ("GET", "", None),
    ("DELETE", "", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("POST", "/renew-expiration", {"expiresAt": "2099-01-01T00:00:00Z"}),
    ("PATCH", "/metadata", {"k": "v"}),
    ("GET", "/endpoints/44772", None),
    ("GET", "/endpoints/8080?use_server_proxy=true", None),
    ("GET", "/proxy/44772/ping", None),
    ("POST", "/proxy/44772/command", {"command": "id"}),
    ("GET", "/networkpolicy", None),
    ("GET", "/diagnostics/context", None),
    ("GET", "/diagnostics/logs?scope=container", None),
    ("GET", "/diagnostics/events?scope=runtime", None),
    ("GET", "/diagnostics/logs", None),
    ("GET", "/diagnostics/events", None),
    ("GET", "/diagnostics/inspect", None),
    ("GET", "/diagnostics/summary", None),
]


async def test_tenants_see_and_touch_only_their_own(tenant_harness: Harness) -> None:
    h = tenant_harness
    async with h.client(KEY_A) as a, h.client(KEY_B) as b, h.client(API_KEY) as admin:
        sa = (await create(a))["id"]
        sb = (await create(b))["id"]
        s0 = (await create(admin))["id"]  # the default tenant's: the admin's only
        for c, sid in ((a, sa), (b, sb), (admin, s0)):
            await h.wait_state(c, sid, "Running")
        unknown_id = str(uuid.uuid4())
        for method, suffix, body in SANDBOX_ROUTES:
            for c, theirs in ((b, sa), (a, sb), (a, s0)):
                r = await c.request(method, f"/v1/sandboxes/{theirs}{suffix}", json=body)
                u = await c.request(method, f"/v1/sandboxes/{unknown_id}{suffix}", json=body)
                same_as_unknown(r, u, theirs, unknown_id)
        # Lists hold one's own only; the admin's holds both.
        for c, mine in ((a, sa), (b, sb)):
            ids = [i["id"] for i in (await c.get("/v1/sandboxes")).json()["items"]]
            assert ids == [mine]
        listed = (await admin.get("/v1/sandboxes", params={"pageSize": 200})).json()
        assert {sa, sb, s0} <= {i["id"] for i in listed["items"]}
        # Both still Running, untouched by the other's attempts; each may act on its own.
        for c, sid in ((a, sa), (b, sb)):
            assert (await c.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Running"
            assert (await c.get(f"/v1/sandboxes/{sid}/endpoints/44772")).status_code == 200
        # The admin reaches a tenant's sandbox (and its execd token).
        r = await admin.get(f"/v1/sandboxes/{sa}/endpoints/44772")
        assert r.status_code == 200 and r.json()["headers"]
        # Pools are shared: tenants may not create, resize or delete them.
        r = await a.post("/v1/pools", json={"name": "p", "template": {}, "capacitySpec": {}})
        assert r.status_code == 403 and r.json()["code"] == "ADMIN_ONLY"
        # The owner is stored: a fresh process would load it.
        store = await SandboxStore.open(h.cfg.store_url)
        try:
            owners = {r.id: r.owner for r in await store.load_all()}
        finally:
            await store.close()
        assert (owners[sa], owners[sb], owners[s0]) == ("team-a", "team-b", None)
        # Deleting one's own works; the other tenant's is still there.
        assert (await a.delete(f"/v1/sandboxes/{sa}")).status_code == 204
        assert (await b.get(f"/v1/sandboxes/{sb}")).status_code == 200


async def test_a_quota_breach_is_a_clear_429_and_creates_nothing(
        tenant_harness: Harness) -> None:
    h = tenant_harness
    async with h.client(KEY_A) as a, h.client(KEY_B) as b:
        first = await create(a)  # 500m, 256Mi of team-a's 1 core, 1Gi, 2 sandboxes
        await h.wait_state(a, first["id"], "Running")
        before_store = {r.id for r in h.service.records()}
        before_runtime = await h.runtime.list_ids()
        breaches = [({"cpu": "600m"}, "cpu quota of 1 cores"),
                    ({"cpu": "250m", "memory": "900Mi"}, "memory quota of 1Gi")]
        for limits, words in breaches:
            r = await a.post("/v1/sandboxes", json={**BODY, "resourceLimits": limits})
            assert r.status_code == 429, r.text
            assert r.json()["code"] == "TENANT_QUOTA_EXCEEDED"
            assert words in r.json()["message"] and "team-a" in r.json()["message"]
        second = await create(a, cpu="500m", memory="512Mi")  # exactly fills the cpu quota
        await h.wait_state(a, second["id"], "Running")
        r = await a.post("/v1/sandboxes", json={**BODY, "resourceLimits": {"cpu": "100m"}})
        assert r.status_code == 429 and "quota of 2" in r.json()["message"]
        # Nothing was recorded or started for the refused creates.
        assert {r.id for r in h.service.records()} == before_store | {second["id"]}
        assert await h.runtime.list_ids() == before_runtime | {second["id"]}
        store = await SandboxStore.open(h.cfg.store_url)
        try:
            assert {r.id for r in await store.load_all()} == before_store | {second["id"]}
        finally:
            await store.close()
        # Another tenant's budget is its own; deleting frees team-a's room.
        await create(b, cpu="2")
        assert (await a.delete(f"/v1/sandboxes/{first['id']}")).status_code == 204
        await create(a)


async def test_keys_rotate_without_a_restart(tenant_harness: Harness) -> None:
    h = tenant_harness
    path = Path(h.cfg.tenants.file or "")
    async with h.client(KEY_A) as a, h.client(KEY_A2) as a2, h.client("nope-" * 5) as bad:
        sid = (await create(a))["id"]
        r = await bad.get("/v1/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
        assert (await a2.get("/v1/sandboxes")).status_code == 401
        write_tenants(path, tenants_toml([KEY_A, KEY_A2]))  # the new key beside the old
        assert (await a.get(f"/v1/sandboxes/{sid}")).status_code == 200
        assert (await a2.get(f"/v1/sandboxes/{sid}")).status_code == 200
        write_tenants(path, tenants_toml([KEY_A2]))  # the old key retired
        assert (await a.get(f"/v1/sandboxes/{sid}")).status_code == 401
        assert (await a2.get(f"/v1/sandboxes/{sid}")).status_code == 200
        write_tenants(path, "[[tenants]]\nthis is not toml")  # a broken edit keeps the last
        assert (await a2.get(f"/v1/sandboxes/{sid}")).status_code == 200


async def test_websocket_proxy_refuses_another_tenants_sandbox(tenant_harness: Harness) -> None:
    h = tenant_harness
    base = f"ws://127.0.0.1:{h.cfg.server.port}/v1/sandboxes"
    async with h.client(KEY_A) as a:
        sa = (await create(a))["id"]
        await h.wait_state(a, sa, "Running")
    async with ws_connect(f"{base}/{sa}/proxy/44772/ws",
                          additional_headers={"OPEN-SANDBOX-API-KEY": KEY_A}) as ws:
        await ws.send("hi")
        assert await ws.recv() == "echo:hi"
    refusals = []
    for sid in (sa, str(uuid.uuid4())):  # tenant b: a's sandbox, and an unknown one
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(f"{base}/{sid}/proxy/44772/ws",
                                  additional_headers={"OPEN-SANDBOX-API-KEY": KEY_B}):
                pass
        refusals.append(refused.value.response.status_code)
    assert refusals[0] == refusals[1] == 403  # the handshake refused alike, nothing relayed
