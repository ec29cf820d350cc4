"""``/metrics`` and traces of a running server (fake and real runc runtimes).

The exposition is parsed with prometheus_client's own text parser; counters are read before
and after creates that succeed and fail and a delete. Traces go to the OpenTelemetry SDK's
``InMemorySpanExporter``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sandlot.runtime.execd_client import TOKEN_HEADER
from sandlot.server import app as server_app
from sandlot.server import route_warmup
from sandlot.server.route_warmup import NO_SUCH_PATH
from tests.server.conftest import API_KEY, Harness

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
    # runc sandboxes take execd's endpoint connections whole; the fake runtime's are relayed
    relayed = ["sandlot_endpoint_bytes_total"] if harness.kind == "fake" else []
    for name, direction in (("sandlot_proxy_bytes_total", "from_sandbox"),  # GET: no body in
                            *((n, d) for n in relayed for d in ("to_sandbox", "from_sandbox"))):
        assert value(after_traffic, name, direction=direction) > value(
            before, name, direction=direction), name
    handoffs = "sandlot_endpoint_handoffs_total"
    assert value(after_traffic, handoffs) == value(before, handoffs) + (
        1 if harness.kind == "oci" else 0)
    if harness.kind == "oci":
        assert all(value(after_traffic, "sandlot_endpoint_bytes_total", direction=d) == value(
            before, "sandlot_endpoint_bytes_total", direction=d)
            for d in ("to_sandbox", "from_sandbox")), "a handed-over connection was relayed"
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


@pytest.mark.fake_only  # the fake's execd is a real server that echoes the headers it got
async def test_a_proxied_request_carries_its_span_s_traceparent_into_the_sandbox(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    exporter = InMemorySpanExporter()
    harness.app.state.observability.tracing.enable(exporter)  # type: ignore[union-attr]
    r = await client.post("/v1/sandboxes", json=BODY)
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller = {"traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01", "tracestate": "k=v"}
    answers = []
    for extra in ({}, caller):
        echoed = await client.get(f"/v1/sandboxes/{sid}/proxy/44772/echo", headers=extra)
        assert echoed.status_code == 200, echoed.text
        answers.append(echoed.json()["headers"])
    proxied = [s for s in exporter.get_finished_spans()
               if s.name == "GET /v1/sandboxes/{sandbox_id}/proxy/{port}/{path:path}"]
    assert len(proxied) == 2
    for seen, span in zip(answers, proxied, strict=True):
        version, trace_id, parent_id, flags = seen["traceparent"].split("-")
        assert version == "00" and int(flags, 16) & 1  # sampled (bit 2: random trace id)
        assert trace_id == format(span.context.trace_id, "032x")
        assert parent_id == format(span.context.span_id, "016x")  # the proxy span is the parent
    # the caller's context is the proxy span's parent, and its tracestate travels on
    assert proxied[0].parent is None
    assert proxied[1].context.trace_id == int(caller_trace, 16)
    assert proxied[1].parent is not None and proxied[1].parent.span_id == 0x00F067AA0BA902B7
    assert answers[1]["tracestate"] == "k=v"
    await client.delete(f"/v1/sandboxes/{sid}")


async def _websocket_session(harness: Harness, client: httpx.AsyncClient, sid: str) -> None:
    """One WebSocket session through the server proxy: execd's PTY on the real runtime (a
    shell echoes the typed command), the fake execd's echo endpoint on the fake one."""
    from websockets.asyncio.client import connect

    base = harness.base.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/proxy/44772"
    headers = {"OPEN-SANDBOX-API-KEY": API_KEY}
    if harness.kind == "fake":
        async with connect(f"{base}/ws", additional_headers=headers) as ws:
            await ws.send("hello through the proxy")
            assert await asyncio.wait_for(ws.recv(), 10) == "echo:hello through the proxy"
        return
    created = await client.post(f"/v1/sandboxes/{sid}/proxy/44772/pty", json={})
    assert created.status_code in (200, 201), created.text
    session = created.json()["session_id"]
    async with connect(f"{base}/pty/{session}/ws", additional_headers=headers) as ws:
        seen = ""
        await ws.send(b"\x00" + b"echo W$((6*7))W\n")  # the reference's binary stdin frame
        while "W42W" not in seen:
            frame = await asyncio.wait_for(ws.recv(), 15)
            seen += frame[1:].decode(errors="replace") if isinstance(frame, bytes) else ""
    await client.delete(f"/v1/sandboxes/{sid}/proxy/44772/pty/{session}")


async def test_websocket_traffic_through_the_proxy_is_counted(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    r = await client.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    await harness.wait_state(client, sid, "Running")
    before = await scrape(client)
    await _websocket_session(harness, client, sid)
    after = await scrape(client)
    for direction in ("to_sandbox", "from_sandbox"):
        assert value(after, "sandlot_proxy_bytes_total", direction=direction) > value(
            before, "sandlot_proxy_bytes_total", direction=direction), direction
    # the stdin frame (or echoed text) at least: the payloads themselves were counted
    sent = value(after, "sandlot_proxy_bytes_total", direction="to_sandbox") - value(
        before, "sandlot_proxy_bytes_total", direction="to_sandbox")
    assert sent >= len("hello through the proxy" if harness.kind == "fake" else "echo W$((6*7))W")
    await client.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.fake_only
async def test_the_route_warm_up_at_start_is_not_a_request(
    harness: Harness, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route tables are built at start by one request routed around the middleware
    (route_warmup.py): it is not counted (nor traced or logged), and its 404 is dropped."""
    routed: list[object] = []

    async def recorded(router: Any) -> None:
        routed.append(router)
        await route_warmup.build_routes(router)

    monkeypatch.setattr(server_app, "build_routes", recorded)
    await harness.stop()
    await harness.start()
    assert harness.app is not None and routed == [harness.app.router]
    counted = [labels for (name, labels) in (await scrape(client))
               if name == "sandlot_http_requests_total"]
    assert not [labels for labels in counted if ("status", "404") in labels], counted
    r = await client.get(NO_SUCH_PATH)
    assert r.status_code == 404
    after = [labels for (name, labels) in (await scrape(client))
             if name == "sandlot_http_requests_total" and ("status", "404") in labels]
    assert len(after) == 1, after  # a client's own 404 is


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
async def test_large_diagnostics_go_by_a_short_lived_url(harness: Harness) -> None:
    await harness.stop()
    harness.cfg.diagnostics.max_inline_bytes = 1024
    harness.cfg.diagnostics.delivery = "auto"
    await harness.start()
    async with harness.client() as client, harness.client(key=None) as anon:
        r = await client.post("/v1/sandboxes", json=BODY)
        sid = r.json()["id"]
        await harness.wait_state(client, sid, "Running")
        small = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                                  params={"scope": "runtime"})).json()
        assert small["delivery"] == "inline" and "contentUrl" not in small  # under the limit
        for _ in range(4):  # four events per cycle: past 1 KiB
            assert (await client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 202
            await harness.wait_state(client, sid, "Paused")
            assert (await client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 202
            await harness.wait_state(client, sid, "Running")
        body = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                                 params={"scope": "runtime"})).json()
        assert body["delivery"] == "url" and "content" not in body
        assert body["truncated"] is False  # all of it, not the inline tail
        assert body["contentUrl"].startswith(f"{harness.base}/v1/diagnostics/downloads/")
        expires = datetime.fromisoformat(body["expiresAt"].replace("Z", "+00:00"))
        assert timedelta(0) < expires - datetime.now(UTC) <= timedelta(seconds=301)
        got = await anon.get(body["contentUrl"])  # the URL is the credential: no key
        assert got.status_code == 200, got.text
        assert got.headers["content-type"].startswith("text/plain")
        assert len(got.content) == body["contentLength"] > 1024
        assert "Sandbox created" in got.text  # the oldest events are there
        assert got.text.rstrip().endswith("Resuming -> Running (CONTAINER_RUNNING)")
        # the released SDK reads the same descriptor
        from opensandbox import SandboxManager
        from opensandbox.config import ConnectionConfig

        manager = await SandboxManager.create(connection_config=ConnectionConfig(
            domain=f"127.0.0.1:{harness.cfg.server.port}", api_key=API_KEY))
        try:
            sdk = await manager.get_diagnostic_events(sid, "runtime")
        finally:
            await manager.close()
        assert sdk.delivery == "url" and sdk.content is None and sdk.content_url
        assert (await anon.get(sdk.content_url)).text == got.text
        # a guessed token, and an expired URL: the contract's error shape
        wrong = await anon.get(body["contentUrl"][:-4] + "AAAA")
        assert wrong.status_code == 404
        assert wrong.json()["code"] == "DIAGNOSTICS_DOWNLOAD_NOT_FOUND"
        harness.app.state.diagnostic_downloads.ttl_seconds = 1e-9  # type: ignore[union-attr]
        stale = (await client.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                                  params={"scope": "runtime"})).json()
        gone = await anon.get(stale["contentUrl"])
        assert gone.status_code == 404 and set(gone.json()) >= {"code", "message"}
        await client.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.fake_only
async def test_expiry_is_an_event_readable_after_the_end(
    harness: Harness, client: httpx.AsyncClient
) -> None:

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
