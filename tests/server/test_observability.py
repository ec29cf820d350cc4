"""``/metrics`` and traces of a running server (fake and real runc runtimes).

The exposition is parsed with prometheus_client's own text parser; counters are read before
and after creates that succeed and fail and a delete. Traces go to the OpenTelemetry SDK's
``InMemorySpanExporter``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sandlot.runtime.execd_client import TOKEN_HEADER
from tests.server.conftest import Harness

BODY = {"image": {"uri": "python:3.12"}, "entrypoint": ["tail", "-f", "/dev/null"],
        "timeout": 600, "resourceLimits": {"cpu": "500m", "memory": "256Mi"}}


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(m: dict, name: str, **labels: str) -> float:
    return float(m.get((name, tuple(sorted(labels.items()))), 0.0))


async def test_metrics_parse_and_move_with_creates_failures_and_deletes(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    async with harness.client(key=None) as anon:
        assert (await anon.get("/metrics")).status_code == 401  # behind the key by default
    before = await scrape(client)
    assert ("sandlot_sandboxes", (("state", "Running"),)) in before
    if harness.kind == "oci":  # the fake runtime has no warm pool
        assert ("sandlot_warm_pool_ready", (("pool", "default"),)) in before

    r = await client.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    bad = await client.post("/v1/sandboxes", json={**BODY, "image": {"uri": "nowhere/none:1"}})
    assert bad.status_code >= 400
    middle = await scrape(client)
    created = "sandlot_sandbox_create_duration_seconds_count"
    assert value(middle, created, outcome="success") == value(before, created,
                                                               outcome="success") + 1
    assert value(middle, created, outcome="failure") == value(before, created,
                                                               outcome="failure") + 1
    assert value(middle, "sandlot_sandboxes", state="Running") == value(
        before, "sandlot_sandboxes", state="Running") + 1
    posts = "sandlot_http_requests_total"
    assert value(middle, posts, method="POST", route="/v1/sandboxes", status="202") == value(
        before, posts, method="POST", route="/v1/sandboxes", status="202") + 1

    # bytes through the server proxy and a direct endpoint (execd's /ping both times)
    token = harness.service.execd_token(harness.service.get(sid))
    ping = await client.get(f"/v1/sandboxes/{sid}/proxy/44772/ping")
    assert ping.status_code == 200
    endpoint = (await client.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()["endpoint"]
    async with httpx.AsyncClient() as direct:
        assert (await direct.get(f"http://{endpoint}/ping",
                                 headers={TOKEN_HEADER: token})).status_code == 200
    # the events route samples the sandbox (CPU/memory) at once
    await client.get(f"/v1/sandboxes/{sid}/diagnostics/events", params={"scope": "all"})
    after_traffic = await scrape(client)
    for name, direction in (("sandlot_proxy_bytes_total", "to_sandbox"),
                            ("sandlot_proxy_bytes_total", "from_sandbox"),
                            ("sandlot_endpoint_bytes_total", "to_sandbox"),
                            ("sandlot_endpoint_bytes_total", "from_sandbox")):
        if direction == "to_sandbox" and name.startswith("sandlot_proxy"):
            continue  # a GET has no body
        assert value(after_traffic, name, direction=direction) > value(
            before, name, direction=direction), name
    if harness.kind == "oci":  # the fake runtime has no cgroups
        assert value(after_traffic, "sandlot_sandbox_memory_bytes", sandbox_id=sid) > 0
        assert value(after_traffic, "sandlot_sandbox_cpu_seconds_total", sandbox_id=sid) > 0

    assert (await client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    after = await scrape(client)
    deleted = "sandlot_sandbox_delete_duration_seconds_count"
    assert value(after, deleted, outcome="success") == value(before, deleted,
                                                              outcome="success") + 1
    assert value(after, "sandlot_sandboxes", state="Running") == value(
        before, "sandlot_sandboxes", state="Running")
    assert not any(labels == (("sandbox_id", sid),) for _, labels in after)  # forgotten


@pytest.mark.fake_only
async def test_metrics_can_be_open_to_scrapers(harness: Harness) -> None:
    await harness.stop()
    harness.cfg.metrics.open = True
    await harness.start()
    async with harness.client(key=None) as anon:
        assert (await anon.get("/metrics")).status_code == 200
        assert (await anon.get("/v1/sandboxes")).status_code == 401  # nothing else opens


async def test_a_create_trace_has_the_expected_spans(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    exporter = InMemorySpanExporter()
    harness.app.state.observability.tracing.enable(exporter)  # type: ignore[union-attr]
    r = await client.post("/v1/sandboxes", json=BODY)
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    assert (await client.get(f"/v1/sandboxes/{sid}/proxy/44772/ping")).status_code == 200
    for _ in range(100):  # the provision span ends just after Running is stored
        if any(s.name == "sandbox.provision" for s in exporter.get_finished_spans()):
            break
        await asyncio.sleep(0.02)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server = spans["POST /v1/sandboxes"]
    create = spans["sandbox.create"]
    provision = spans["sandbox.provision"]
    assert create.parent is not None and create.parent.span_id == server.context.span_id
    assert provision.parent is not None and provision.parent.span_id == create.context.span_id
    # A cold OCI start waits for execd inside runtime.create (it holds its start slot until
    # execd answers); the server's own execd.wait_ready span appears only when it waits itself.
    children = ["runtime.create", "store.save_running"]
    children += ["execd.wait_ready"] if "execd.wait_ready" in spans else []
    for child in children:
        span = spans[child]
        assert span.parent is not None and span.parent.span_id == provision.context.span_id
        assert span.context.trace_id == server.context.trace_id
    assert create.attributes is not None and create.attributes["sandlot.sandbox_id"] == sid
    assert server.attributes is not None and server.attributes["http.response.status_code"] == 202
    proxied = spans["GET /v1/sandboxes/{sandbox_id}/proxy/{port}/{path:path}"]
    assert proxied.attributes is not None
    assert proxied.attributes["sandlot.sandbox_id"] == sid
    assert proxied.attributes["sandlot.port"] == "44772"
    assert proxied.resource.attributes["service.name"] == "sandlot"
    await client.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.fake_only
async def test_large_diagnostics_keep_their_tail_and_say_truncated(harness: Harness) -> None:
    await harness.stop()
    harness.cfg.diagnostics.max_inline_bytes = 1024
    await harness.start()
    async with harness.client() as client:
        r = await client.post("/v1/sandboxes", json=BODY)
        sid = r.json()["id"]
        await harness.wait_state(client, sid, "Running")
        for _ in range(4):  # four events per cycle
            assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
            await harness.wait_state(client, sid, "Paused")
            assert (await client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 202
            await harness.wait_state(client, sid, "Running")
        body = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                                 params={"scope": "runtime"})).json()
        assert body["truncated"] is True
        assert len(body["content"].encode()) <= 1024
        assert body["content"].rstrip().endswith("Resuming -> Running (CONTAINER_RUNNING)")
        assert "Sandbox created" not in body["content"]  # the oldest went
        await client.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.fake_only
async def test_expiry_is_an_event_readable_after_the_end(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    from datetime import timedelta

    from sandlot.server.models import utcnow

    sid = (await client.post("/v1/sandboxes", json=BODY)).json()["id"]
    await harness.wait_state(client, sid, "Running")
    svc = harness.service
    svc.get(sid).expires_at = utcnow() + timedelta(seconds=0.1)
    svc.expiry.schedule(sid, svc.get(sid).expires_at)
    for _ in range(200):
        if (await client.get(f"/v1/sandboxes/{sid}")).status_code == 404:
            break
        await asyncio.sleep(0.05)
    events = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                               params={"scope": "runtime"})).json()["content"]
    assert "Expired" in events and "Stopping -> Terminated (ttl_expiry)" in events
