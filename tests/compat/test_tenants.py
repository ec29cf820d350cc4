"""Two tenants and the admin against a real ``sandlot serve`` (tenants file, OCI runtime),
through the released ``opensandbox`` SDK and raw HTTP.

Neither tenant can list, get, delete, proxy into or run commands in the other's sandboxes
(404, as for an unknown id), nor use the other's snapshots; the other's execd direct endpoint
refuses its token; a quota breach is a clear 429 and leaves nothing in the store or the
runtime; the admin ([server] api_key) sees all; a key rotates by editing the file, with no
restart (and SIGHUP re-reads it at once).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.config import ConnectionConfig
from opensandbox.constants import DEFAULT_EXECD_PORT
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.sandboxes import SandboxFilter

from tests.compat.conftest import COMPAT_IMAGE, RAW_CREATE_BODY, SandlotServer, needs_backend
from tests.tenants.tenants_setup import KEY_A, KEY_A2, KEY_B, tenants_toml, write_tenants

KEY_A3 = "team-a-sighup--key-0123456789"  # as long as KEY_A2: an in-place edit keeps the size


@pytest.fixture(scope="module")
def tenant_server(compat_image_root: Path) -> Iterator[SandlotServer]:
    needs_backend("oci")
    server = SandlotServer(compat_image_root)
    path = server.data_dir / "tenants.toml"
    write_tenants(path, tenants_toml())
    with open(server.config, "a") as fh:
        fh.write(f'[tenants]\nfile = "{path}"\n')
    server.start()
    try:
        yield server
    finally:
        server.destroy()  # as the admin: every tenant's sandboxes go


def sdk(server: SandlotServer, key: str, proxy: bool = False) -> ConnectionConfig:
    return ConnectionConfig(domain=server.domain, api_key=key, use_server_proxy=proxy,
                            request_timeout=timedelta(seconds=60))


def http(server: SandlotServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"OPEN-SANDBOX-API-KEY": key}, timeout=60)


async def new_sandbox(server: SandlotServer, key: str) -> Sandbox:
    return await Sandbox.create(COMPAT_IMAGE, connection_config=sdk(server, key),
                                resource={"cpu": "250m", "memory": "256Mi"},
                                timeout=timedelta(minutes=10),
                                ready_timeout=timedelta(seconds=90))


def assert_unknown(r: httpx.Response, sid: str, c: httpx.Client, path: str) -> None:
    """``r`` is answered exactly as the same request about a made-up id."""
    other = str(uuid.uuid4())
    u = c.request(r.request.method, path.replace(sid, other),
                  content=r.request.content or None,
                  headers={"content-type": "application/json"})
    assert r.status_code == 404 == u.status_code, (path, r.status_code, r.text)
    assert r.text.replace(sid, "ID") == u.text.replace(other, "ID")


async def test_tenants_are_isolated_through_the_sdk_and_raw_http(
        tenant_server: SandlotServer) -> None:
    s = tenant_server
    sa = await new_sandbox(s, KEY_A)
    sb = await new_sandbox(s, KEY_B)
    manager_b = await SandboxManager.create(connection_config=sdk(s, KEY_B))
    try:
        # The SDK as tenant B: A's sandbox is not there for it.
        listed = await manager_b.list_sandbox_infos(SandboxFilter(page_size=100))
        assert [i.id for i in listed.sandbox_infos] == [sb.id]
        for call in (manager_b.get_sandbox_info, manager_b.kill_sandbox,
                     manager_b.pause_sandbox):
            with pytest.raises(SandboxApiException) as err:
                await call(sa.id)
            assert err.value.status_code == 404, call
        for proxy in (False, True):
            with pytest.raises(SandboxException):
                await Sandbox.connect(sa.id, connection_config=sdk(s, KEY_B, proxy))

        # Raw HTTP as tenant B: every way in is a 404 like an unknown id.
        with http(s, KEY_B) as b:
            for method, path, body in [
                ("GET", f"/v1/sandboxes/{sa.id}", None),
                ("DELETE", f"/v1/sandboxes/{sa.id}", None),
                ("GET", f"/v1/sandboxes/{sa.id}/endpoints/{DEFAULT_EXECD_PORT}", None),
                ("POST", f"/v1/sandboxes/{sa.id}/proxy/{DEFAULT_EXECD_PORT}/command",
                 {"command": "echo leaked"}),
                ("GET", f"/sandboxes/{sa.id}/proxy/{DEFAULT_EXECD_PORT}/ping", None),
                ("POST", f"/v1/sandboxes/{sa.id}/snapshots", None),
            ]:
                r = b.request(method, path, json=body)
                assert_unknown(r, sa.id, b, path)

        # execd direct endpoints: A's refuses B's token (and none); A's own token works.
        ep_a = await sa.get_endpoint(DEFAULT_EXECD_PORT)
        ep_b = await sb.get_endpoint(DEFAULT_EXECD_PORT)
        token_b = ep_b.headers["X-EXECD-ACCESS-TOKEN"]
        url_a = f"http://{ep_a.endpoint}/command"
        for headers in ({"X-EXECD-ACCESS-TOKEN": token_b}, {}):
            r = httpx.post(url_a, json={"command": "echo leaked"}, headers=headers, timeout=30)
            assert r.status_code in (401, 403), (r.status_code, r.text)
            assert "leaked" not in r.text
        run = await sa.commands.run("echo mine")
        assert run.logs.stdout[0].text.strip() == "mine"

        # Both untouched by B's attempts; the admin sees both.
        assert (await sa.get_info()).status.state == "Running"
        with s.client() as admin:
            ids = {i["id"] for i in admin.get("/v1/sandboxes",
                                              params={"pageSize": 200}).json()["items"]}
            assert {sa.id, sb.id} <= ids
            assert admin.get(f"/v1/sandboxes/{sa.id}").status_code == 200
    finally:
        for box in (sa, sb):
            await box.kill()
            await box.close()
        await manager_b.close()


async def test_snapshots_belong_to_the_sandbox_tenant(tenant_server: SandlotServer) -> None:
    s = tenant_server
    with http(s, KEY_A) as a, http(s, KEY_B) as b:
        r = a.post("/v1/sandboxes", json=RAW_CREATE_BODY)
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        try:
            deadline = time.monotonic() + 120
            while a.get(f"/v1/sandboxes/{sid}").json()["status"]["state"] != "Running":
                assert time.monotonic() < deadline
                time.sleep(0.2)
            snap = a.post(f"/v1/sandboxes/{sid}/snapshots", json={"name": "a-snap"}).json()
            while a.get(f"/v1/snapshots/{snap['id']}").json()["status"]["state"] == "Creating":
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert a.get(f"/v1/snapshots/{snap['id']}").json()["status"]["state"] == "Ready"
            assert [i["id"] for i in b.get("/v1/snapshots").json()["items"]] == []
            assert [i["id"] for i in a.get("/v1/snapshots").json()["items"]] == [snap["id"]]
            for method, path in (("GET", f"/v1/snapshots/{snap['id']}"),
                                 ("DELETE", f"/v1/snapshots/{snap['id']}")):
                assert_unknown(b.request(method, path), snap["id"], b, path)
            r = b.post("/v1/sandboxes", json={**{k: v for k, v in RAW_CREATE_BODY.items()
                                                   if k != "image"},
                                               "snapshotId": snap["id"]})
            assert r.status_code == 404 and r.json()["code"] == "SNAPSHOT::NOT_FOUND", r.text
            assert a.delete(f"/v1/sandboxes/{sid}").status_code == 204
            assert a.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
        finally:
            a.delete(f"/v1/sandboxes/{sid}")


async def test_quota_breach_is_a_clear_error_and_creates_nothing(
        tenant_server: SandlotServer) -> None:
    s = tenant_server
    boxes = [await new_sandbox(s, KEY_A) for _ in range(2)]  # team-a's quota: 2 sandboxes
    try:
        before = s.runtime_ids()
        with s.client() as admin:
            listed_before = admin.get("/v1/sandboxes", params={"pageSize": 200}).json()
        with pytest.raises(SandboxApiException) as err:
            await new_sandbox(s, KEY_A)
        assert err.value.status_code == 429
        assert err.value.error is not None and err.value.error.code == "TENANT_QUOTA_EXCEEDED"
        assert "team-a" in (err.value.error.message or "")
        with http(s, KEY_A) as a:  # raw: the contract's {code, message}
            r = a.post("/v1/sandboxes", json=RAW_CREATE_BODY)
            assert r.status_code == 429 and set(r.json()) == {"code", "message"}
        assert s.runtime_ids() == before
        with s.client() as admin:
            listed = admin.get("/v1/sandboxes", params={"pageSize": 200}).json()
        assert listed["pagination"]["totalItems"] == listed_before["pagination"]["totalItems"]
        # Team b is not held to team a's quota.
        other = await new_sandbox(s, KEY_B)
        await other.kill()
        await other.close()
    finally:
        for box in boxes:
            await box.kill()
            await box.close()


def test_a_key_rotates_without_a_restart(tenant_server: SandlotServer) -> None:
    s = tenant_server
    path = s.data_dir / "tenants.toml"
    assert s.proc is not None
    pid = s.proc.pid
    try:
        with http(s, KEY_A) as a, http(s, KEY_A2) as a2:
            assert a2.get("/v1/sandboxes").status_code == 401
            write_tenants(path, tenants_toml([KEY_A, KEY_A2]))
            assert a.get("/v1/sandboxes").status_code == 200
            assert a2.get("/v1/sandboxes").status_code == 200
            write_tenants(path, tenants_toml([KEY_A2]))
            r = a.get("/v1/sandboxes")
            assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
            assert a2.get("/v1/sandboxes").status_code == 200
            # SIGHUP re-reads the file at once, also an edit in place that kept its size
            # and modification time (which the per-request check cannot see).
            before = path.stat()
            path.write_text(tenants_toml([KEY_A3]))
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert path.stat().st_size == before.st_size
            with http(s, KEY_A3) as a3:
                assert a3.get("/v1/sandboxes").status_code == 401  # not noticed yet
                s.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 30
                while a3.get("/v1/sandboxes").status_code != 200:
                    assert time.monotonic() < deadline, "SIGHUP did not reload the file"
                    time.sleep(0.1)
            assert a2.get("/v1/sandboxes").status_code == 401
        assert s.proc is not None and s.proc.pid == pid and s.proc.poll() is None  # no restart
    finally:
        write_tenants(path, tenants_toml())


def test_templates_are_their_tenants_and_pools_are_shared(tenant_server: SandlotServer) -> None:
    s = tenant_server
    with http(s, KEY_A) as a, http(s, KEY_B) as b, s.client() as admin:
        def build(limits: dict[str, str]) -> tuple[str, dict]:
            r = a.post("/v1/templates", json={"image": COMPAT_IMAGE, "resourceLimits": limits,
                                              "entrypoint": ["sh", "-c", "echo a > /opt/m"]})
            assert r.status_code == 201, r.text
            tid = r.json()["templateId"]
            deadline = time.monotonic() + 240
            while (got := a.get(f"/v1/templates/{tid}").json())["status"]["phase"] not in (
                    "Succeeded", "Failed"):
                assert time.monotonic() < deadline, got
                time.sleep(0.3)
            return tid, got

        # The build sandbox is team-a's: held to its quota (1Gi in all).
        over, got = build({"cpu": "250m", "memory": "2Gi"})
        assert got["status"]["phase"] == "Failed"
        assert "memory quota" in got["status"]["message"], got
        assert a.delete(f"/v1/templates/{over}").status_code == 204
        tid, got = build({"cpu": "250m", "memory": "256Mi"})
        assert got["status"]["phase"] == "Succeeded", got
        # Tenant b: no such template, whichever way it asks.
        assert [t["templateId"] for t in b.get("/v1/templates").json()["items"]] == []
        for method, path in (("GET", f"/v1/templates/{tid}"),
                             ("GET", f"/v1/templates/{tid}/logs"),
                             ("DELETE", f"/v1/templates/{tid}")):
            assert_unknown(b.request(method, path), tid, b, path)
        r = b.post("/v1/sandboxes", json={"templateId": tid, "timeout": 600,
                                          "entrypoint": ["tail", "-f", "/dev/null"]})
        assert r.status_code == 404 and r.json()["code"] == "TEMPLATE_NOT_FOUND", r.text
        # Its snapshot is team-a's too (not listed to b, listed to a).
        assert b.get("/v1/snapshots").json()["items"] == []
        assert len(a.get("/v1/snapshots").json()["items"]) == 1

        # Pools: the admin's to manage, every tenant's to claim from; a claim is the claimer's.
        pool = {"name": "shared", "capacitySpec": {"bufferMax": 1, "bufferMin": 0,
                                                   "poolMax": 4, "poolMin": 0},
                "template": {"spec": {"containers": [{"image": COMPAT_IMAGE}]}}}
        r = b.post("/v1/pools", json=pool)
        assert r.status_code == 403 and r.json()["code"] == "ADMIN_ONLY"
        assert admin.post("/v1/pools", json=pool).status_code == 201
        try:
            assert [p["name"] for p in b.get("/v1/pools").json()["items"]] == ["shared"]
            assert b.delete("/v1/pools/shared").status_code == 403
            r = b.post("/v1/sandboxes", json={"extensions": {"poolRef": "shared"},
                                              "entrypoint": ["tail", "-f", "/dev/null"],
                                              "timeout": 600})
            assert r.status_code == 202, r.text
            pooled = r.json()["id"]
            assert b.get(f"/v1/sandboxes/{pooled}").status_code == 200
            assert a.get(f"/v1/sandboxes/{pooled}").status_code == 404
            assert b.delete(f"/v1/sandboxes/{pooled}").status_code == 204
        finally:
            admin.delete("/v1/pools/shared")
        assert a.delete(f"/v1/templates/{tid}").status_code == 204
