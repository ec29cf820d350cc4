"""The lifecycle routes over a real HTTP server, over the fake and the real runtime."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Harness

BODY = {
    "image": {"uri": "python:3.12"},
    "entrypoint": ["tail", "-f", "/dev/null"],
    "timeout": 600,
    "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
    "env": {"A": "1"},
    "metadata": {"team": "ml", "name": "first"},
}


async def create(client: httpx.AsyncClient, **overrides: object) -> dict:
    r = await client.post("/v1/sandboxes", json={**BODY, **overrides})
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.fake_only
async def test_create_reaches_running_with_limits_and_token(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    body = await create(client)
    assert body["status"]["state"] in ("Pending", "Running")  # Running when it starts fast
    assert body["entrypoint"] == ["tail", "-f", "/dev/null"]
    assert "expiresAt" in body and "image" not in body
    got = await harness.wait_state(client, body["id"], "Running")
    assert got["image"] == {"uri": "python:3.12"}
    assert got["metadata"] == {"team": "ml", "name": "first"}
    spec = harness.runtime.created[-1]
    assert spec.cpu_cores == 0.5
    assert spec.memory_bytes == 512 * 2**20
    assert spec.env == {"A": "1"}
    assert spec.execd_token and len(spec.execd_token) >= 32
    assert spec.pids_limit == harness.cfg.runtime.pids_limit


@pytest.mark.fake_only
async def test_keep_alive_entrypoints_are_recorded_but_not_started(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    for idle in (["tail", "-f", "/dev/null"], ["sleep", "infinity"]):
        body = await create(client, entrypoint=idle)
        await harness.wait_state(client, body["id"], "Running")
        assert harness.runtime.created[-1].entrypoint == []  # execd keeps the sandbox alive
        r = await client.get(f"/v1/sandboxes/{body['id']}")
        assert r.json()["entrypoint"] == idle
    body = await create(client, entrypoint=["python3", "-m", "http.server"])
    await harness.wait_state(client, body["id"], "Running")
    assert harness.runtime.created[-1].entrypoint == ["python3", "-m", "http.server"]


async def test_unversioned_aliases(harness: Harness, client: httpx.AsyncClient) -> None:
    body = await create(client)
    r = await client.get(f"/sandboxes/{body['id']}")
    assert r.status_code == 200 and r.json()["id"] == body["id"]
    r = await client.get("/sandboxes")
    assert [s["id"] for s in r.json()["items"]] == [body["id"]]


async def test_no_timeout_means_no_expiry(harness: Harness, client: httpx.AsyncClient) -> None:
    body = await create(client, timeout=None)
    assert "expiresAt" not in body
    got = await harness.wait_state(client, body["id"], "Running")
    assert "expiresAt" not in got


@pytest.mark.fake_only
async def test_image_pull_and_pulling_reason(harness: Harness, client: httpx.AsyncClient) -> None:
    harness.images.pull_gate = asyncio.Event()
    body = await create(
        client, image={"uri": "registry.test/app:1", "auth": {"username": "u", "password": "p"}}
    )
    for _ in range(200):
        got = (await client.get(f"/v1/sandboxes/{body['id']}")).json()
        if got["status"].get("message", "").startswith("Pulling image"):
            break
        await asyncio.sleep(0.01)
    assert got["status"]["state"] == "Pending"
    assert got["status"]["reason"] == "CONTAINER_STARTING"
    assert got["status"]["message"] == "Pulling image registry.test/app:1."
    harness.images.pull_gate.set()
    await harness.wait_state(client, body["id"], "Running")
    name, auth = harness.images.pulls[-1]
    assert name == "registry.test/app:1" and auth is not None and auth.password == "p"
    # The registry password is never echoed back.
    assert "auth" not in (await client.get(f"/v1/sandboxes/{body['id']}")).json()["image"]


@pytest.mark.fake_only
async def test_a_pull_failure_after_the_answer_leaves_a_failed_sandbox_saying_why(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 0  # answered Pending before the pull fails
    body = await create(client, image={"uri": "nope/missing:1"})
    got = await harness.wait_state(client, body["id"], "Failed")
    assert got["status"]["reason"] == "PROVISIONING_ERROR"
    assert got["status"]["message"].startswith("Failed to pull image nope/missing:1: ")
    # A failed sandbox stays listed until deleted, and deleting it works.
    r = await client.delete(f"/v1/sandboxes/{body['id']}")
    assert r.status_code == 204
    assert (await client.get(f"/v1/sandboxes/{body['id']}")).status_code == 404


@pytest.mark.fake_only
async def test_a_start_failure_after_the_answer_leaves_a_failed_sandbox_saying_why(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 0
    harness.runtime.fail_create = "runc exploded"
    body = await create(client)
    got = await harness.wait_state(client, body["id"], "Failed")
    assert got["status"]["reason"] == "PROVISIONING_ERROR"
    assert got["status"]["message"].startswith("Failed to create or start container: ")
    assert "runc exploded" in got["status"]["message"]


async def test_list_filters_and_pagination(harness: Harness, client: httpx.AsyncClient) -> None:
    ids = [(await create(client, metadata={"n": str(i), "grp": "a.b-c"}))["id"] for i in range(5)]
    other = (await create(client, metadata={"grp": "other"}))["id"]
    for sid in [*ids, other]:
        await harness.wait_state(client, sid, "Running")
    await client.post(f"/v1/sandboxes/{ids[0]}/pause")

    r = await client.get("/v1/sandboxes", params={"pageSize": 2, "page": 2})
    page = r.json()
    assert page["pagination"] == {
        "page": 2,
        "pageSize": 2,
        "totalItems": 6,
        "totalPages": 3,
        "hasNextPage": True,
    }
    assert len(page["items"]) == 2

    r = await client.get("/v1/sandboxes", params=[("state", "Paused")])
    assert [s["id"] for s in r.json()["items"]] == [ids[0]]
    r = await client.get("/v1/sandboxes", params=[("state", "Paused"), ("state", "Running")])
    assert r.json()["pagination"]["totalItems"] == 6

    r = await client.get("/v1/sandboxes", params={"metadata": "grp=a.b-c&n=3"})
    assert [s["id"] for s in r.json()["items"]] == [ids[3]]


async def test_pause_resume_and_conflicts(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]
    # Pending sandboxes cannot be paused yet (may race to Running; accept only 409 or 202).
    await harness.wait_state(client, sid, "Running")
    r = await client.post(f"/v1/sandboxes/{sid}/resume")
    assert r.status_code == 409 and r.json()["code"] and "Running" in r.json()["message"]
    assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
    assert (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Paused"
    assert (await harness.runtime.inspect(sid)).state.value == "paused"
    r = await client.post(f"/v1/sandboxes/{sid}/pause")
    assert r.status_code == 409 and set(r.json()) == {"code", "message"}
    assert (await client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 202
    assert (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Running"


async def test_renew_and_metadata_patch(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]
    new = (datetime.now(UTC) + timedelta(hours=5)).replace(microsecond=0)
    r = await client.post(
        f"/v1/sandboxes/{sid}/renew-expiration",
        json={"expiresAt": new.isoformat().replace("+00:00", "Z")},
    )
    assert r.status_code == 200, r.text
    assert datetime.fromisoformat(r.json()["expiresAt"]) == new
    # Renewal is not capped by max_sandbox_timeout_seconds (3600 here), only creation is.
    assert harness.service.expiry.pending()[sid] == new

    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    r = await client.post(f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": past})
    assert r.status_code == 400 and r.json()["code"] == "DOCKER::INVALID_EXPIRATION"

    r = await client.patch(
        f"/v1/sandboxes/{sid}/metadata", json={"team": None, "env": "prod", "absent": None}
    )
    assert r.status_code == 200
    assert r.json()["metadata"] == {"name": "first", "env": "prod"}
    r = await client.patch(f"/v1/sandboxes/{sid}/metadata", json={})
    assert r.json()["metadata"] == {"name": "first", "env": "prod"}
    r = await client.patch(f"/v1/sandboxes/{sid}/metadata", json={"opensandbox.io/x": "1"})
    assert r.status_code == 400


async def test_expiry_deletes_sandbox(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]
    await harness.wait_state(client, sid, "Running")
    soon = datetime.now(UTC) + timedelta(seconds=0.3)
    r = await client.post(
        f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": soon.isoformat()}
    )
    assert r.status_code == 200
    for _ in range(200):
        if (await client.get(f"/v1/sandboxes/{sid}")).status_code == 404:
            break
        await asyncio.sleep(0.02)
    assert (await client.get(f"/v1/sandboxes/{sid}")).status_code == 404
    assert sid not in await harness.runtime.list_ids()


@pytest.mark.fake_only
async def test_delete_during_pull_cancels_provisioning(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.images.pull_gate = asyncio.Event()
    sid = (await create(client, image={"uri": "registry.test/app:1"}))["id"]
    await asyncio.sleep(0.05)
    assert (await client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    harness.images.pull_gate.set()
    await asyncio.sleep(0.05)
    assert (await client.get(f"/v1/sandboxes/{sid}")).status_code == 404
    assert sid not in await harness.runtime.list_ids()


async def test_health_and_version_need_no_key(harness: Harness) -> None:
    async with harness.client(key=None) as anon:
        assert (await anon.get("/health")).json() == {"status": "healthy"}
        v = (await anon.get("/version")).json()
        assert v["version"]
        r = await anon.get("/v1/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == "MISSING_API_KEY"
    async with harness.client(key="wrong") as bad:
        r = await bad.get("/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == "INVALID_API_KEY"
        assert set(r.json()) == {"code", "message"}
        assert r.headers.get("x-request-id")


async def test_error_shapes(harness: Harness, client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/sandboxes/does-not-exist")
    assert r.status_code == 404 and set(r.json()) == {"code", "message"}
    r = await client.delete("/v1/sandboxes/does-not-exist")
    assert r.status_code == 404
    r = await client.post("/v1/sandboxes", json={**BODY, "timeout": 7200})
    assert r.status_code == 400 and "3600" in r.json()["message"]
    r = await client.post("/v1/sandboxes", json={**BODY, "timeout": "soon"})
    assert r.status_code == 422 and r.json()["code"] == "INVALID_REQUEST"
    assert "timeout" in r.json()["message"]
    r = await client.post(
        "/v1/sandboxes", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and set(r.json()) == {"code", "message", "detail"}
    r = await client.post("/v1/sandboxes", json={**BODY, "resourceLimits": {"cpu": "lots"}})
    assert r.status_code == 400 and "cpu" in r.json()["message"]
    r = await client.post("/v1/sandboxes", json={**BODY, "entrypoint": []})
    assert r.status_code == 422
    r = await client.post("/v1/sandboxes", json={"snapshotId": "snap-1"})
    if harness.runtime.capabilities.snapshots:
        assert r.status_code == 404 and r.json()["code"] == "SNAPSHOT::NOT_FOUND"
        r = await client.post("/v1/sandboxes/x/snapshots", json={})
        assert r.status_code == 404 and r.json()["code"] == "DOCKER::SANDBOX_NOT_FOUND"
        r = await client.post("/v1/sandboxes/x/snapshots", json={"name": ""})
        assert r.status_code == 422
        r = await client.get("/v1/snapshots", params={"state": "Ready"})
        assert r.status_code == 200 and r.json()["items"] == []
        r = await client.delete("/v1/snapshots/snap-1")
        assert r.status_code == 404 and r.json()["code"] == "SNAPSHOT::NOT_FOUND"
        # image and snapshotId together: the reference's model check, a 422
        r = await client.post("/v1/sandboxes", json={**BODY, "snapshotId": "snap-1"})
        assert r.status_code == 422 and "snapshotId" in r.json()["message"]
    else:
        assert r.status_code == 501 and r.json()["code"] == "SNAPSHOT::NOT_IMPLEMENTED"
        r = await client.post("/v1/sandboxes/x/snapshots", json={})
        assert r.status_code == 501 and "snapshot" in r.json()["message"]
        r = await client.get("/v1/snapshots")
        assert r.status_code == 501
    r = await client.get("/v1/pools")
    if harness.runtime.capabilities.pools:
        assert r.status_code == 200 and r.json() == {"items": []}
        r = await client.post("/v1/sandboxes", json={"extensions": {"poolRef": "none"},
                                                     "entrypoint": ["x"]})
        assert r.status_code == 404 and "pool" in r.json()["message"]
        assert r.json()["code"] == "KUBERNETES::POOL_NOT_FOUND"
    else:  # the reference's answers on its single-host server
        assert r.status_code == 501 and "pools" in r.json()["message"]
        assert r.json()["code"] == "KUBERNETES::POOL_NOT_SUPPORTED"
        r = await client.post("/v1/sandboxes", json={**BODY, "extensions": {"poolRef": "p"}})
        assert r.status_code == 400 and r.json()["code"] == "SANDBOX::UNSUPPORTED_POOL_REF"
    vols = [{"name": "v", "host": {"path": "/srv"}, "mountPath": "/d"}]
    r = await client.post("/v1/sandboxes", json={**BODY, "volumes": vols})
    if "host" in harness.runtime.capabilities.volume_kinds:
        assert r.status_code == 400 and r.json()["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED"
        assert "/srv" in r.json()["message"]  # no [storage] allowed_host_paths configured
    else:
        assert r.status_code == 501 and "host volumes" in r.json()["message"]
    vols = [{"name": "v", "ossfs": {"bucket": "b", "endpoint": "e"}, "mountPath": "/d"}]
    r = await client.post("/v1/sandboxes", json={**BODY, "volumes": vols})
    assert r.status_code == 501 and "ossfs volumes" in r.json()["message"]
    r = await client.post("/v1/sandboxes", json={**BODY, "volumes": [{"name": "v",
                                                                      "mountPath": "/d"}]})
    assert r.status_code == 400 and "exactly one backend" in r.json()["message"]
    r = await client.get("/v1/no-such-route")
    assert r.status_code == 404 and r.json()["detail"] == "Not Found"
    assert await harness.runtime.list_ids() == set()


async def test_create_answers_running_when_the_sandbox_starts_within_the_wait(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 60.0  # a cold create on a busy machine
    body = await create(client)
    assert body["status"]["state"] == "Running"


async def test_create_answers_pending_at_once_when_waiting_is_off(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 0
    body = await create(client)
    assert body["status"]["state"] == "Pending"
    await harness.wait_state(client, body["id"], "Running")


@pytest.mark.fake_only
async def test_a_create_slower_than_the_wait_is_stored_before_it_answers(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    from sandlot.server.store import SandboxStore

    harness.cfg.server.create_wait_seconds = 0.05
    create_container = harness.runtime.create

    async def slow_create(spec, progress=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.5)
        return await create_container(spec, progress)

    harness.runtime.create = slow_create  # type: ignore[method-assign]
    body = await create(client)
    assert body["status"]["state"] == "Pending"
    store = await SandboxStore.open(f"sqlite+aiosqlite:///{harness.cfg.data_dir / 'sandlot.db'}")
    try:
        stored = {r.id: r for r in await store.load_all()}
        assert stored[body["id"]].state.value == "Pending"  # named in an answer: stored
    finally:
        await store.close()
    await harness.wait_state(client, body["id"], "Running")


@pytest.mark.fake_only
async def test_server_start_prewarms_the_pooled_images_it_has(harness: Harness) -> None:
    # "base" is stored (FakeImages), so the default pool list asks the runtime to keep it warm.
    assert harness.runtime.prewarmed == ["base"]


async def test_no_prewarm_when_the_pool_is_off(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cfg.runtime.warm_pool_size = 0
    await h.start()
    try:
        assert h.runtime.prewarmed == []
    finally:
        await h.stop()
        await h.runtime.stop_all()
        shutil.rmtree(h.short_root, ignore_errors=True)


@pytest.mark.fake_only
async def test_resource_requests_reach_a_runtime_that_schedules_by_them(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    """resourceRequests: refused (400) by a backend without requests, checked against the
    limits and handed over as the spec's requests by one with them."""
    r = await client.post("/v1/sandboxes", json={**BODY, "resourceRequests": {"cpu": "100m"}})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "SANDBOX::INVALID_PARAMETER"
    assert "resourceRequests are not supported by the" in r.json()["message"]

    caps = harness.runtime.capabilities
    harness.runtime.capabilities = dataclasses.replace(caps, resource_requests=True)
    try:
        body = await create(client, resourceRequests={"cpu": "100m", "memory": "64Mi"})
        await harness.wait_state(client, body["id"], "Running")
        spec = harness.runtime.created[-1]
        assert (spec.cpu_request_cores, spec.memory_request_bytes) == (0.1, 64 << 20)
        assert (spec.cpu_cores, spec.memory_bytes) == (0.5, 512 << 20)
        for bad, words in (({"cpu": "2"}, "exceeds the sandbox's cpu limit"),
                           ({"memory": "1Gi"}, "exceeds the sandbox's memory limit"),
                           ({"nvidia.com/gpu": "1"}, "nvidia.com/gpu is not supported"),
                           ({"cpu": "lots"}, "cpu")):
            r = await client.post("/v1/sandboxes", json={**BODY, "resourceRequests": bad})
            assert r.status_code == 400, (bad, r.text)
            assert words in r.json()["message"], (bad, r.text)
        body = await create(client, resourceRequests=None)
        await harness.wait_state(client, body["id"], "Running")
        assert harness.runtime.created[-1].cpu_request_cores is None
    finally:
        harness.runtime.capabilities = caps
