"""Direct endpoints (loopback listeners) and the server proxy (HTTP, SSE, WebSocket)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

from tests.server.conftest import API_KEY, Harness
from tests.server.test_lifecycle_api import create


async def running(harness: Harness, client: httpx.AsyncClient) -> str:
    sid = (await create(client))["id"]
    await harness.wait_state(client, sid, "Running")
    return sid


@pytest.mark.fake_only
async def test_direct_execd_endpoint_forwards_with_token(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/44772")
    assert r.status_code == 200
    ep = r.json()
    host, port = ep["endpoint"].split(":")
    assert host == "127.0.0.1"
    token = ep["headers"]["X-EXECD-ACCESS-TOKEN"]
    assert token == harness.runtime.created[-1].execd_token
    async with httpx.AsyncClient(base_url=f"http://{ep['endpoint']}") as direct:
        assert (await direct.get("/ping", headers=ep["headers"])).text == "pong"
        assert (await direct.get("/ping")).status_code == 401  # execd checks the token
        echoed = (await direct.post("/echo?x=1", content=b"hi", headers=ep["headers"])).json()
        assert echoed["body"] == "hi" and echoed["query"] == "x=1"
    # Same answer the second time (one listener per sandbox port).
    again = (await client.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()
    assert again["endpoint"] == ep["endpoint"]
    # Deleting the sandbox closes the listener.
    assert (await client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    try:
        _, w = await asyncio.open_connection("127.0.0.1", int(port))
    except OSError:
        pass
    else:
        w.close()
        raise AssertionError("endpoint listener still open after delete")


@pytest.mark.fake_only
async def test_direct_endpoint_for_other_port(harness: Harness, client: httpx.AsyncClient) -> None:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"hello:" + await r.readline())
        await w.drain()
        w.close()

    srv = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        harness.runtime.tcp_services[8000] = srv.sockets[0].getsockname()[1]
        sid = await running(harness, client)
        ep = (await client.get(f"/v1/sandboxes/{sid}/endpoints/8000")).json()
        assert "headers" not in ep  # omitted when there are none, as on the reference
        host, port = ep["endpoint"].split(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"abc\n")
        await w.drain()
        assert await r.read() == b"hello:abc\n"
        w.close()
        # Port 18080 (egress) answers like any other port even with nothing listening.
        ep2 = (await client.get(f"/v1/sandboxes/{sid}/endpoints/18080")).json()
        assert ep2["endpoint"].startswith("127.0.0.1:")
    finally:
        srv.close()
        await srv.wait_closed()


async def test_endpoint_errors(harness: Harness, client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/sandboxes/nope/endpoints/44772")).status_code == 404
    sid = await running(harness, client)
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/70000")
    assert r.status_code == 400 and r.json()["code"] == "DOCKER::INVALID_PORT"
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/44772", params={"expires": "1"})
    assert r.status_code == 400 and r.json()["code"] == "SANDBOX::API_NOT_SUPPORTED"


@pytest.mark.fake_only
async def test_server_proxy_http_and_sse(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    r = await client.get(
        f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": "true"}
    )
    ep = r.json()
    assert ep["endpoint"] == f"127.0.0.1:{harness.cfg.server.port}/sandboxes/{sid}/proxy/44772"
    headers = {**ep["headers"], "OPEN-SANDBOX-API-KEY": API_KEY}
    async with httpx.AsyncClient(base_url=f"http://{ep['endpoint']}", headers=headers) as px:
        assert (await px.get("/ping")).text == "pong"
        echoed = (await px.put("/echo?a=b", content=b"payload")).json()
        assert echoed["method"] == "PUT" and echoed["body"] == "payload"
        assert echoed["query"] == "a=b"
        # The API key never travels into the sandbox; the execd token does.
        assert "open-sandbox-api-key" not in echoed["headers"]
        assert echoed["headers"]["x-execd-access-token"] == ep["headers"]["X-EXECD-ACCESS-TOKEN"]
        events = []
        async with px.stream("GET", "/events") as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    events.append(line)
        assert events == ["data: event 0", "data: event 1", "data: event 2"]
    # Unversioned alias of the proxy route, and the auth gate in front of it.
    async with httpx.AsyncClient(base_url=harness.base) as anon:
        assert (await anon.get(f"/sandboxes/{sid}/proxy/44772/ping")).status_code == 401
    r = await client.get(f"/sandboxes/{sid}/proxy/44772/ping", headers=ep["headers"])
    assert r.text == "pong"


@pytest.mark.fake_only
async def test_server_proxy_websocket(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    url = f"ws://127.0.0.1:{harness.cfg.server.port}/v1/sandboxes/{sid}/proxy/44772/ws"
    async with ws_connect(url, additional_headers={"OPEN-SANDBOX-API-KEY": API_KEY}) as ws:
        await ws.send("hi")
        assert await ws.recv() == "echo:hi"


async def test_proxy_refuses_paused_sandbox(harness: Harness, client: httpx.AsyncClient) -> None:
    sid = await running(harness, client)
    await client.post(f"/v1/sandboxes/{sid}/pause")
    r = await client.get(f"/v1/sandboxes/{sid}/proxy/44772/ping")
    assert r.status_code == 409 and "Paused" in r.json()["message"]


@pytest.mark.fake_only
async def test_renew_on_access_through_proxy(harness: Harness, client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/sandboxes",
        json={
            "image": {"uri": "python:3.12"},
            "timeout": 60,
            "extensions": {"access.renew.extend.seconds": "900"},
        },
    )
    sid = r.json()["id"]
    first = (await harness.wait_state(client, sid, "Running"))["expiresAt"]
    r = await client.get(f"/v1/sandboxes/{sid}/proxy/44772/ping")
    assert r.text == "pong"
    later = (await client.get(f"/v1/sandboxes/{sid}")).json()["expiresAt"]
    from datetime import datetime

    delta = datetime.fromisoformat(later) - datetime.fromisoformat(first)
    assert delta.total_seconds() > 800
    bad = {"image": {"uri": "python:3.12"}, "extensions": {"access.renew.extend.seconds": "5"}}
    r = await client.post("/v1/sandboxes", json=bad)
    assert r.status_code == 400 and "300" in r.json()["message"]
