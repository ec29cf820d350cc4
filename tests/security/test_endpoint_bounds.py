"""Issue 11, finding 4: endpoints are bounded - port range, listeners per sandbox, open
connections per sandbox, idle connections closed (real HTTP server, fake runtime)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tests.server.conftest import Harness

BODY = {"image": {"uri": "python:3.12"}, "entrypoint": ["tail", "-f", "/dev/null"],
        "timeout": 600}


async def running(harness: Harness, client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    sid = str(r.json()["id"])
    await harness.wait_state(client, sid, "Running")
    return sid


@pytest.mark.parametrize("port", ["-5", "0", "65536", str(10**15), str(10**20)])
async def test_out_of_range_ports_are_400_and_open_nothing(
    harness: Harness, client: httpx.AsyncClient, port: str
) -> None:
    sid = await running(harness, client)
    before = harness.service.forwarder.listener_count(sid)
    r = await client.get(f"/v1/sandboxes/{sid}/proxy/{port}/")
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"code", "message"} and "port" in r.json()["message"]
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/{port}")
    assert r.status_code in (400, 422), r.text
    assert set(r.json()) == {"code", "message"}
    assert harness.service.forwarder.listener_count(sid) == before


async def test_listeners_per_sandbox_are_capped(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    cap = harness.cfg.server.max_endpoints_per_sandbox
    port, answers = 20000, []
    while harness.service.forwarder.listener_count(sid) < cap:
        r = await client.get(f"/v1/sandboxes/{sid}/endpoints/{port}")
        assert r.status_code == 200, r.text
        port += 1
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/{port}")
    answers.append(r)
    assert r.status_code == 429, r.text
    assert "max_endpoints_per_sandbox" in r.json()["message"]
    assert harness.service.forwarder.listener_count(sid) == cap
    # Already open ones are still handed out.
    assert (await client.get(f"/v1/sandboxes/{sid}/endpoints/20000")).status_code == 200


async def _execd_endpoint(harness: Harness, client: httpx.AsyncClient, sid: str) -> int:
    r = await client.get(f"/v1/sandboxes/{sid}/endpoints/{harness.cfg.execd.port}")
    assert r.status_code == 200, r.text
    return int(r.json()["endpoint"].rsplit(":", 1)[1])


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer closes within ``seconds`` (whatever it still sent is skipped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _ping(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    return sock.recv(100)


# The server runs in this test's event loop: blocking socket calls go to threads.
async def test_idle_raw_connections_are_closed(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    harness.service.forwarder.idle_timeout = 0.5
    host_port = await _execd_endpoint(harness, client, sid)
    with socket.create_connection(("127.0.0.1", host_port)) as s:
        # A live connection is served...
        assert (await asyncio.to_thread(_ping, s)).startswith(b"HTTP/1.1 ")
        # ...and closed once it has been silent for longer than the idle timeout.
        assert await asyncio.to_thread(_closed_within, s, 3)  # execd itself waits 5 s


async def test_connections_per_sandbox_are_capped(
    harness: Harness, client: httpx.AsyncClient
) -> None:
    sid = await running(harness, client)
    harness.service.forwarder.max_connections = 2
    host_port = await _execd_endpoint(harness, client, sid)
    held = [socket.create_connection(("127.0.0.1", host_port)) for _ in range(2)]
    try:
        for s in held:  # both served
            assert (await asyncio.to_thread(_ping, s)).startswith(b"HTTP/1.1 ")
        with socket.create_connection(("127.0.0.1", host_port)) as extra:
            assert await asyncio.to_thread(_closed_within, extra, 5)
    finally:
        for s in held:
            s.close()
