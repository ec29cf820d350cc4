"""The lifecycle API answers as the reference server does, point by point (raw HTTP).

Each test pins one line of docs/compatibility.md: the status, the ``code``, the reason or the
shape a client of the reference server sees. The app runs over the fake runtime.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

from tests.server.conftest import API_KEY, Harness
from tests.server.test_lifecycle_api import BODY, create

# Wire shapes, over the fake runtime (whose hooks inject the failures): the same behaviours
# over the real runtime are pinned through ``sandlot serve`` in
# tests/compat/test_reference_wire_sdk.py, so the suite is not run twice here.
pytestmark = pytest.mark.fake_only


def error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert body["message"]
    return str(body["message"])


async def running(harness: Harness, client: httpx.AsyncClient, **overrides: object) -> str:
    sid = str((await create(client, **overrides))["id"])
    await harness.wait_state(client, sid, "Running")
    return sid


# ----- authentication ------------------------------------------------------------------


async def test_a_missing_api_key_is_missing_api_key(harness: Harness) -> None:
    async with harness.client(key=None) as anon:
        error(await anon.get("/v1/sandboxes"), 401, "MISSING_API_KEY")
        error(
            await anon.get("/sandboxes", headers={"OPEN-SANDBOX-API-KEY": ""}),
            401,
            "MISSING_API_KEY",
        )


async def test_a_wrong_api_key_is_invalid_api_key(harness: Harness) -> None:
    async with harness.client(key="not-the-key") as bad:
        r = await bad.post("/v1/sandboxes", json=BODY)
        error(r, 401, "INVALID_API_KEY")
        assert r.headers["x-request-id"]
    assert harness.runtime.created == []


async def test_the_request_id_given_is_echoed(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/sandboxes", headers={"X-Request-ID": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"


# ----- list ------------------------------------------------------------------------------


async def test_list_is_newest_first(harness: Harness, client: httpx.AsyncClient) -> None:
    ids = [str((await create(client))["id"]) for _ in range(3)]
    items = (await client.get("/v1/sandboxes")).json()["items"]
    assert [s["id"] for s in items] == ids[::-1]
    page2 = (await client.get("/sandboxes", params={"pageSize": 2, "page": 2})).json()
    assert [s["id"] for s in page2["items"]] == [ids[0]]


async def test_an_empty_list_has_zero_pages(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/sandboxes")).json()
    assert body == {
        "items": [],
        "pagination": {
            "page": 1,
            "pageSize": 20,
            "totalItems": 0,
            "totalPages": 0,
            "hasNextPage": False,
        },
    }


async def test_page_size_is_at_most_200(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/sandboxes", params={"pageSize": 200})).status_code == 200
    r = await client.get("/v1/sandboxes", params={"pageSize": 201})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "pageSize"]


async def test_a_malformed_metadata_filter_is_invalid_metadata_format(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/v1/sandboxes", params={"metadata": "team=ml&broken"})
    error(r, 400, "INVALID_METADATA_FORMAT")


async def test_state_filter_ignores_case(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    items = (await client.get("/v1/sandboxes", params={"state": "running"})).json()["items"]
    assert [s["id"] for s in items] == [sid]


# ----- create validation -------------------------------------------------------------------


async def test_a_body_pydantic_refuses_is_422_with_the_reference_detail(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "timeout": 59})
    assert r.status_code == 422
    body = r.json()
    assert body["detail"][0]["loc"] == ["body", "timeout"]
    assert body["detail"][0]["type"] == "greater_than_equal"
    assert body["code"] and "timeout" in body["message"]
    assert harness.runtime.created == []


@pytest.mark.parametrize(
    "body",
    [
        {"entrypoint": ["x"]},
        {"image": {"uri": "python:3.12"}, "snapshotId": "s-1", "entrypoint": ["x"]},
        {"image": {"uri": "  "}, "snapshotId": " ", "entrypoint": ["x"]},
    ],
    ids=["neither", "both", "blank"],
)
async def test_exactly_one_of_image_or_snapshot_id(client: httpx.AsyncClient, body: dict) -> None:
    r = await client.post("/v1/sandboxes", json=body)
    assert r.status_code == 422
    assert "Exactly one of image or snapshotId" in r.json()["detail"][0]["msg"]


async def test_timeout_above_the_maximum_is_invalid_parameter(client: httpx.AsyncClient) -> None:
    message = error(
        await client.post("/v1/sandboxes", json={**BODY, "timeout": 3601}),
        400,
        "SANDBOX::INVALID_PARAMETER",
    )
    assert "3600" in message


async def test_a_timeout_too_large_for_a_date_is_invalid_parameter(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.max_sandbox_timeout_seconds = None
    r = await client.post("/v1/sandboxes", json={**BODY, "timeout": 10**15})
    error(r, 400, "SANDBOX::INVALID_PARAMETER")


@pytest.mark.parametrize(
    "metadata",
    [
        {"opensandbox.io/id": "x"},
        {"bad key": "v"},
        {"-leading": "v"},
        {"Example.com/name": "v"},
        {"k": "has space"},
        {"k": "x" * 64},
        {"k": "trailing-"},
    ],
)
async def test_metadata_follows_label_rules_on_create(
    harness: Harness, client: httpx.AsyncClient, metadata: dict
) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "metadata": metadata})
    error(r, 400, "SANDBOX::INVALID_METADATA_LABEL")
    assert harness.runtime.created == []


async def test_label_shaped_metadata_is_accepted(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    metadata = {"example.com/team": "ml", "a": "", "x_y.z-1": "A_b.c-9", "n": "x" * 63}
    body = await create(client, metadata=metadata)
    assert body["metadata"] == metadata


async def test_null_maps_and_null_env_values_are_accepted(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    body = await create(
        client,
        env={"KEEP": "1", "DROP": None},
        metadata=None,
        resourceLimits=None,
        extensions=None,
    )
    await harness.wait_state(client, body["id"], "Running")
    assert harness.runtime.created[-1].env == {"KEEP": "1"}


@pytest.mark.parametrize(
    ("platform", "code"),
    [
        ({"os": "macos", "arch": "amd64"}, "SANDBOX::INVALID_PARAMETER"),
        ({"os": "linux", "arch": "riscv64"}, "SANDBOX::INVALID_PARAMETER"),
    ],
)
async def test_platform_outside_the_vocabulary_is_invalid_parameter(
    client: httpx.AsyncClient, platform: dict, code: str
) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "platform": platform})
    assert platform["os"] in error(r, 400, code) or platform["arch"] in r.json()["message"]


async def test_secure_access_is_refused_with_invalid_parameter(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "secureAccess": True})
    error(r, 400, "SANDBOX::INVALID_PARAMETER")


# ----- create outcome and status reasons -------------------------------------------------


async def test_status_reasons_follow_the_container_state(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 5.0
    body = await create(client)
    assert body["status"]["state"] == "Running"
    assert body["status"]["reason"] == "CONTAINER_RUNNING"
    assert body["status"]["message"] == "Sandbox container started successfully."
    sid = body["id"]
    got = (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]
    assert (got["reason"], got["message"]) == ("CONTAINER_RUNNING", "Sandbox container is running.")
    assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
    got = (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]
    assert (got["state"], got["reason"], got["message"]) == (
        "Paused",
        "CONTAINER_PAUSED",
        "Sandbox container is paused.",
    )
    assert (await client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 202
    got = (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]
    assert (got["state"], got["reason"]) == ("Running", "CONTAINER_RUNNING")


async def test_a_pending_sandbox_is_container_starting(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 0
    body = await create(client)
    assert body["status"]["state"] == "Pending"
    assert body["status"]["reason"] == "CONTAINER_STARTING"
    assert body["status"]["message"] == "Sandbox container is starting."


async def test_a_pull_failure_answers_the_create_and_leaves_nothing(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "image": {"uri": "nope/missing:1"}})
    message = error(r, 500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED")
    assert message.startswith("Failed to pull image nope/missing:1: ")
    assert (await client.get("/v1/sandboxes")).json()["items"] == []
    assert harness.runtime.containers == {}


async def test_a_start_failure_answers_the_create_and_leaves_nothing(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.runtime.fail_create = "runc exploded"
    message = error(
        await client.post("/v1/sandboxes", json=BODY), 500, "DOCKER::SANDBOX_START_FAILED"
    )
    assert message.startswith("Failed to create or start container: ") and "runc" in message
    assert (await client.get("/v1/sandboxes")).json()["items"] == []


# ----- get / delete / pause / resume on wrong states ----------------------------------------


async def test_an_unknown_sandbox_is_sandbox_not_found_on_every_route(
    client: httpx.AsyncClient,
) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for method, path, body in [
        ("GET", "/v1/sandboxes/nope", None),
        ("DELETE", "/v1/sandboxes/nope", None),
        ("POST", "/v1/sandboxes/nope/pause", None),
        ("POST", "/v1/sandboxes/nope/resume", None),
        ("POST", "/v1/sandboxes/nope/renew-expiration", {"expiresAt": later}),
        ("PATCH", "/v1/sandboxes/nope/metadata", {"a": "b"}),
        ("GET", "/v1/sandboxes/nope/endpoints/44772", None),
        ("GET", "/sandboxes/nope", None),
    ]:
        r = await client.request(method, path, json=body)
        assert error(r, 404, "DOCKER::SANDBOX_NOT_FOUND") == "Sandbox nope not found.", path


async def test_pause_when_not_running_is_sandbox_not_running(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
    error(await client.post(f"/v1/sandboxes/{sid}/pause"), 409, "DOCKER::SANDBOX_NOT_RUNNING")


async def test_resume_when_not_paused_is_sandbox_not_paused(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    error(await client.post(f"/v1/sandboxes/{sid}/resume"), 409, "DOCKER::SANDBOX_NOT_PAUSED")


async def test_a_runtime_pause_failure_is_sandbox_pause_failed(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)

    async def broken(sandbox_id: str) -> None:
        raise OSError("freezer refused")

    harness.runtime.pause = broken  # type: ignore[method-assign]
    error(await client.post(f"/v1/sandboxes/{sid}/pause"), 500, "DOCKER::SANDBOX_PAUSE_FAILED")
    assert (await client.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Running"


async def test_a_paused_sandbox_can_be_deleted(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
    assert (await client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    error(await client.delete(f"/v1/sandboxes/{sid}"), 404, "DOCKER::SANDBOX_NOT_FOUND")


async def test_concurrent_deletes_answer_204_then_404(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    answers = await asyncio.gather(*(client.delete(f"/v1/sandboxes/{sid}") for _ in range(3)))
    assert sorted(r.status_code for r in answers) == [204, 404, 404]


# ----- renew ---------------------------------------------------------------------------------


async def test_renew_without_a_timeout_is_invalid_expiration_409(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = (await create(client, timeout=None))["id"]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = await client.post(f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": later})
    error(r, 409, "DOCKER::INVALID_EXPIRATION")
    assert "expiresAt" not in (await client.get(f"/v1/sandboxes/{sid}")).json()


async def test_renew_to_the_past_is_invalid_expiration_400(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    r = await client.post(f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": past})
    assert (
        error(r, 400, "DOCKER::INVALID_EXPIRATION") == "New expiration time must be in the future."
    )


async def test_renew_may_shorten_and_answers_in_utc(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = (await create(client))["id"]  # timeout 600
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=120)
    offset = soon.astimezone(timezone(timedelta(hours=8)))
    r = await client.post(
        f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": offset.isoformat()}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"expiresAt": soon.isoformat().replace("+00:00", "Z")}
    assert harness.service.expiry.pending()[sid] == soon


async def test_a_renew_time_without_zone_is_utc(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = (await create(client))["id"]
    later = datetime.now(UTC).replace(microsecond=0, tzinfo=None) + timedelta(hours=2)
    r = await client.post(
        f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": later.isoformat()}
    )
    assert r.status_code == 200, r.text
    assert r.json()["expiresAt"] == later.isoformat() + "Z"


async def test_renew_of_a_paused_sandbox_works(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = await client.post(f"/v1/sandboxes/{sid}/renew-expiration", json={"expiresAt": later})
    assert r.status_code == 200


# ----- metadata patch ----------------------------------------------------------------------


async def test_patching_a_reserved_key_is_invalid_metadata_label_without_prefix(
    client: httpx.AsyncClient,
) -> None:
    sid = (await create(client))["id"]
    r = await client.patch(f"/v1/sandboxes/{sid}/metadata", json={"opensandbox.io/x": None})
    error(r, 400, "INVALID_METADATA_LABEL")


async def test_patched_values_follow_label_rules(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]
    r = await client.patch(f"/v1/sandboxes/{sid}/metadata", json={"k": "not ok"})
    error(r, 400, "SANDBOX::INVALID_METADATA_LABEL")
    r = await client.patch(f"/v1/sandboxes/{sid}/metadata", json={"k": 1})
    assert r.status_code == 422


async def test_patch_is_a_json_merge_patch(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["id"]  # metadata team=ml, name=first
    r = await client.patch(f"/sandboxes/{sid}/metadata", json={"team": None, "env": "prod"})
    assert r.status_code == 200
    assert r.json()["metadata"] == {"name": "first", "env": "prod"}
    assert r.json()["image"] == {"uri": "python:3.12"}  # the full Sandbox comes back


# ----- endpoints -----------------------------------------------------------------------------


async def test_endpoint_strings_in_direct_and_server_proxy_modes(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    direct = (await client.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()
    host, port = direct["endpoint"].split(":")
    assert host == "127.0.0.1" and port.isdigit() and "/" not in port
    proxied = (
        await client.get(f"/v1/sandboxes/{sid}/endpoints/8080", params={"use_server_proxy": True})
    ).json()
    assert proxied == {
        "endpoint": f"127.0.0.1:{harness.cfg.server.port}/sandboxes/{sid}/proxy/8080"
    }
    # That unversioned path is served (with the API key), as the SDK uses it.
    async with httpx.AsyncClient(headers={"OPEN-SANDBOX-API-KEY": API_KEY}) as c:
        r = await c.get(
            f"http://{proxied['endpoint'].replace('8080', '44772')}/ping", headers=direct["headers"]
        )
    assert r.text == "pong"


async def test_endpoint_parameter_errors_in_the_reference_order(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    base = "/v1/sandboxes/nope/endpoints"
    r = await client.get(f"{base}/0", params={"use_server_proxy": True, "expires": 1})
    error(r, 400, "SANDBOX::INVALID_PARAMETER")
    error(await client.get(f"{base}/0", params={"expires": 1}), 400, "SANDBOX::API_NOT_SUPPORTED")
    error(await client.get(f"{base}/0"), 400, "DOCKER::INVALID_PORT")
    error(await client.get(f"{base}/65536"), 400, "DOCKER::INVALID_PORT")
    error(await client.get(f"{base}/80"), 404, "DOCKER::SANDBOX_NOT_FOUND")
    assert (await client.get(f"{base}/http")).status_code == 422


# ----- unimplemented areas -------------------------------------------------------------------


async def test_unknown_routes_carry_the_reference_detail(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["detail"] == "Not Found"
    r = await client.put("/v1/sandboxes")
    assert r.status_code == 405 and r.json()["detail"] == "Method Not Allowed"


async def test_diagnostics_routes_answer_the_spec_shape_and_refuse_other_scopes(
    client: httpx.AsyncClient,
) -> None:
    sid = (await create(client))["id"]
    for kind, scope in (("logs", "container"), ("logs", "all"), ("events", "runtime"),
                        ("events", "all")):
        r = await client.get(f"/v1/sandboxes/{sid}/diagnostics/{kind}", params={"scope": scope})
        assert r.status_code == 200, r.text
        body = r.json()
        assert {k: body[k] for k in ("sandboxId", "kind", "scope", "delivery")} == {
            "sandboxId": sid, "kind": kind, "scope": scope, "delivery": "inline"}
        assert body["contentType"] == "text/plain; charset=utf-8"
        assert body["truncated"] is False and isinstance(body["content"], str)
        assert set(body) <= {"sandboxId", "kind", "scope", "delivery", "contentType", "content",
                             "contentLength", "truncated", "warnings"}
    events = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                               params={"scope": "runtime"})).json()["content"]
    assert "Pending -> Running" in events
    for kind, scope in (("logs", "runtime"), ("events", "container"), ("logs", "network")):
        r = await client.get(f"/v1/sandboxes/{sid}/diagnostics/{kind}", params={"scope": scope})
        error(r, 400, "DIAGNOSTICS_SCOPE_UNSUPPORTED")
    ctx = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/context")).json()
    assert ctx["sandboxId"] == sid and ctx["state"] == "Running" and ctx["backend"]
    # the deprecated plain-text routes (osb devops)
    for kind in ("logs", "events", "inspect", "summary"):
        r = await client.get(f"/v1/sandboxes/{sid}/diagnostics/{kind}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert sid in (await client.get(f"/v1/sandboxes/{sid}/diagnostics/inspect")).text
    error(await client.get("/sandboxes/nope/diagnostics/logs"), 404, "DOCKER::SANDBOX_NOT_FOUND")
    error(await client.get("/sandboxes/nope/diagnostics/events", params={"scope": "all"}), 404,
          "DOCKER::SANDBOX_NOT_FOUND")


async def test_every_lifecycle_route_has_an_unversioned_alias(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/sandboxes", json=BODY)
    assert r.status_code == 202
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for method, path, body, status in [
        ("GET", "/sandboxes", None, 200),
        ("GET", f"/sandboxes/{sid}", None, 200),
        ("PATCH", f"/sandboxes/{sid}/metadata", {"k": "v"}, 200),
        ("POST", f"/sandboxes/{sid}/renew-expiration", {"expiresAt": later}, 200),
        ("GET", f"/sandboxes/{sid}/endpoints/44772", None, 200),
        ("POST", f"/sandboxes/{sid}/pause", None, 202),
        ("POST", f"/sandboxes/{sid}/resume", None, 202),
        ("DELETE", f"/sandboxes/{sid}", None, 204),
    ]:
        r = await client.request(method, path, json=body)
        assert r.status_code == status, (method, path, r.text)


async def test_a_bad_resource_quantity_is_refused_not_ignored(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    # The reference logs and ignores it (no limit at all); sandlot refuses (compatibility.md C28).
    r = await client.post("/v1/sandboxes", json={**BODY, "resourceLimits": {"memory": "lots"}})
    assert "memory" in error(r, 400, "SANDBOX::INVALID_PARAMETER")
    assert harness.runtime.created == []


async def test_a_pending_sandbox_refuses_pause_and_resume_but_gives_endpoints_and_deletes(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    harness.cfg.server.create_wait_seconds = 0
    harness.images.pull_gate = asyncio.Event()  # the pull never finishes
    sid = (await create(client, image={"uri": "registry.test/app:1"}))["id"]
    error(await client.post(f"/v1/sandboxes/{sid}/pause"), 409, "DOCKER::SANDBOX_NOT_RUNNING")
    error(await client.post(f"/v1/sandboxes/{sid}/resume"), 409, "DOCKER::SANDBOX_NOT_PAUSED")
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/44772")
    assert r.status_code == 200 and r.json()["endpoint"].startswith("127.0.0.1:")
    assert (await client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    harness.images.pull_gate.set()
    error(await client.get(f"/v1/sandboxes/{sid}"), 404, "DOCKER::SANDBOX_NOT_FOUND")
    assert sid not in harness.runtime.containers


async def test_the_proxy_supplies_the_execd_token_a_caller_did_not_send(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    # The reference's proxy adds the endpoint's headers itself; a raw client that passes the
    # API key and ignores ``headers`` reaches execd through sandlot's proxy too.
    sid = await running(harness, client)
    echoed = (await client.post(f"/sandboxes/{sid}/proxy/44772/echo", content=b"x")).json()
    assert echoed["headers"]["x-execd-access-token"] == harness.runtime.created[-1].execd_token
    assert "open-sandbox-api-key" not in echoed["headers"]
    wrong = {"X-EXECD-ACCESS-TOKEN": "not-it"}
    r = await client.get(f"/v1/sandboxes/{sid}/proxy/44772/ping", headers=wrong)
    assert r.status_code == 401  # a token the caller did send is passed on as sent
    url = f"ws://127.0.0.1:{harness.cfg.server.port}/sandboxes/{sid}/proxy/44772/ws"
    async with ws_connect(url, additional_headers={"OPEN-SANDBOX-API-KEY": API_KEY}) as ws:
        await ws.send("hi")
        assert await ws.recv() == "echo:hi"
