"""Issue 11's lifecycle-API findings: out-of-range values are 400s naming the field, every
create gets default and bounded limits, a sandbox cap, a body size limit, and reserved
metadata refused on create as on patch (real HTTP server, fake runtime)."""

from __future__ import annotations

import asyncio
import select
import socket

import httpx
import pytest

from sandlot.config import Config
from sandlot.errors import InvalidRequest
from sandlot.server.bounds import CreateBounds
from tests.server.conftest import API_KEY, Harness

BODY = {"image": {"uri": "python:3.12"}, "entrypoint": ["tail", "-f", "/dev/null"],
        "timeout": 600}


def assert_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"}, body
    for word in words:
        assert word in body["message"], body


async def test_create_without_limits_gets_the_defaults(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    await harness.wait_state(client, r.json()["id"], "Running")
    spec = harness.runtime.created[-1]
    assert spec.cpu_cores == 1.0
    assert spec.memory_bytes == 2 * 2**30
    assert spec.pids_limit == harness.cfg.runtime.pids_limit


@pytest.mark.parametrize(("limits", "field"), [
    ({"cpu": "1000"}, "resourceLimits.cpu"),
    ({"memory": "1Ei"}, "resourceLimits.memory"),
    ({"cpu": "1e30"}, "resourceLimits.cpu"),
    ({"pids": "100000000"}, "resourceLimits.pids"),
    ({"pids": "1.5"}, "resourceLimits.pids"),
    ({"ephemeral-storage": "1Ei"}, "resourceLimits.ephemeral-storage"),  # > the data dir's disk
])
async def test_out_of_range_quantities_are_400_naming_the_field(
    harness: Harness, client: httpx.AsyncClient, limits: dict[str, str], field: str
) -> None:
    r = await client.post("/v1/sandboxes", json={**BODY, "resourceLimits": limits})
    assert_error(r, 400, field)
    assert harness.runtime.created == []


@pytest.mark.parametrize("timeout", [10**15, 10**20, 2**63])
async def test_out_of_range_timeout_is_400(
    harness: Harness, client: httpx.AsyncClient, timeout: int
) -> None:
    harness.service.cfg.server.max_sandbox_timeout_seconds = None
    harness.service.bounds = CreateBounds(harness.service.cfg)
    r = await client.post("/v1/sandboxes", json={**BODY, "timeout": timeout})
    assert r.status_code in (400, 422), r.text
    assert set(r.json()) == {"code", "message"} and "timeout" in r.json()["message"]


async def test_sandbox_cap(harness: Harness, client: httpx.AsyncClient) -> None:
    harness.service.cfg.runtime.max_sandboxes = 2
    harness.service.bounds = CreateBounds(harness.service.cfg)
    ids = []
    for _ in range(2):
        r = await client.post("/v1/sandboxes", json=BODY)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    r = await client.post("/v1/sandboxes", json=BODY)
    assert_error(r, 429, "max_sandboxes")
    assert (await client.delete(f"/v1/sandboxes/{ids[0]}")).status_code == 204
    r = await client.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text


async def test_reserved_metadata_is_refused_on_create_as_on_patch(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/v1/sandboxes",
                          json={**BODY, "metadata": {"opensandbox.io/id": "x"}})
    assert_error(r, 400, "opensandbox.io/")
    r = await client.post("/v1/sandboxes", json=BODY)
    r = await client.patch(f"/v1/sandboxes/{r.json()['id']}/metadata",
                           json={"opensandbox.io/id": "x"})
    assert_error(r, 400, "opensandbox.io/")


async def test_request_bodies_are_size_limited(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    big = {**BODY, "env": {"X": "a" * (2 << 20)}}
    r = await client.post("/v1/sandboxes", json=big)
    assert_error(r, 413, "max_request_body_bytes")

    # A chunked body (no length announced) is cut off once it passes the limit.
    status = await asyncio.to_thread(_post_chunked_until_answered, harness)
    assert status.startswith(b"HTTP/1.1 413"), status


def _post_chunked_until_answered(harness: Harness) -> bytes:
    with socket.create_connection(("127.0.0.1", harness.cfg.server.port), timeout=10) as s:
        s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nTransfer-Encoding: chunked\r\nOPEN-SANDBOX-API-KEY: " + API_KEY.encode()
                  + b"\r\n\r\n")
        chunk = b"a" * 65536
        for _ in range(64):  # 4 MiB at most
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            readable, _, _ = select.select([s], [], [], 0.05)
            if readable:
                return s.recv(4096)
        return b"no answer"


def test_bad_resource_config_is_refused_at_start() -> None:
    for runtime in ({"default_resources": {"cpu": "64", "memory": "1Gi"},
                     "max_resources": {"cpu": "2"}},
                    {"default_resources": {"ephemeral-storage": "2Gi"},
                     "max_resources": {"ephemeral-storage": "1Gi"}},
                    {"default_resources": {"ephemeral-storage": "1Gi"},
                     "default_ephemeral_storage": "2Gi"},
                    {"default_resources": {"disk": "1Gi"}}):
        with pytest.raises(ValueError, match="default_resources"):
            CreateBounds(Config.model_validate({"runtime": runtime}))


def test_ephemeral_storage_has_a_default_and_a_maximum() -> None:
    bounds = CreateBounds(Config.model_validate({"runtime": {
        "default_resources": {"cpu": "1", "ephemeral-storage": "1Gi"},
        "max_resources": {"ephemeral-storage": "4Gi"}}}))
    assert bounds.disk({}) == 2**30  # every create gets a disk cap
    assert bounds.disk({"ephemeral-storage": "4Gi"}) == 4 * 2**30
    with pytest.raises(InvalidRequest, match="resourceLimits.ephemeral-storage"):
        bounds.disk({"ephemeral-storage": "5Gi"})
