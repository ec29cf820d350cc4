"""Issue 11, finding 4: slow and idle clients cannot hold connections open for ever.

``sandlot.http_deadlines`` under a real uvicorn (short deadlines; plain uvicorn beside it as
the baseline that keeps such clients), then wired into the real ``sandlot serve`` (API) and
into execd behind a sandbox's direct endpoint (default deadlines: a request head within 10 s
on the API, 30 s on execd).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from sandlot.http_deadlines import deadline_protocol
from tests.asgi_lifespan import answer_lifespan
from tests.compat.conftest import (  # noqa: F401
    SandlotServer,
    compat_backend,
    compat_image_root,
    fresh_server,
)
from tests.security.running import running_sandbox

HEADER, BODY_IDLE = 0.6, 0.6
# Far beyond either deadline: a connection still open after this was not cut.
CLOSE_WITHIN = 15.0


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    size = 0
    while True:
        msg = await receive()
        size += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = str(size).encode()
    if scope["path"] != "/quiet":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    # A response that says nothing for longer than the deadlines.
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    await asyncio.sleep(3 * max(HEADER, BODY_IDLE))
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _server(http: Any) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=http, log_level="warning", lifespan="on",
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float = CLOSE_WITHIN) -> bool:
    """True once the server closes (EOF or reset); False if still open after ``timeout``."""
    try:
        while True:
            if not await asyncio.wait_for(reader.read(4096), timeout):
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def _trickle(writer: asyncio.StreamWriter, data: bytes, gap: float) -> None:
    with contextlib.suppress(ConnectionError):
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(gap)


@pytest.fixture
async def guarded() -> AsyncIterator[int]:
    async with _server(deadline_protocol(HEADER, BODY_IDLE)) as port:
        yield port


async def test_a_silent_connection_is_closed(guarded: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded)
    assert await _closed_by_server(reader)
    writer.close()


async def test_plain_uvicorn_keeps_a_silent_connection(guarded: int) -> None:
    """The baseline the deadlines fix: uvicorn alone never closes it."""
    async with _server("httptools") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert not await _closed_by_server(reader, timeout=3 * HEADER)
        writer.close()


async def test_a_trickled_request_head_is_cut(guarded: int) -> None:
    """Slowloris: a byte every 0.2 s keeps any idle timer happy; the head deadline is not."""
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded)
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    trickle = asyncio.create_task(_trickle(writer, head, 0.2))
    assert await _closed_by_server(reader)
    trickle.cancel()
    writer.close()


async def test_a_stalled_body_is_cut_and_a_moving_one_is_not(guarded: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    await writer.drain()
    assert await _closed_by_server(reader)  # 90 bytes never come
    writer.close()

    # 20 bytes, one every 0.2 s: longer in all than either deadline, never idle that long.
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
    await _trickle(writer, b"y" * 20, 0.2)
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WITHIN)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert await reader.readexactly(2) == b"20"
    writer.close()


async def test_quiet_responses_and_kept_alive_connections_are_not_cut(guarded: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{guarded}") as c:
        r = await c.get("/quiet")
        assert r.status_code == 200 and r.text == "a0"
        await asyncio.sleep(2 * HEADER)  # idle between requests: uvicorn's keep-alive rules
        r = await c.post("/", content=b"z" * 5)
        assert r.text == "5"
        assert r.extensions["http_version"] == b"HTTP/1.1"


async def test_sandlot_serve_closes_silent_connections_to_the_api_and_to_execd(
    fresh_server: SandlotServer,  # noqa: F811
) -> None:
    """The real server (API) and a sandbox's execd behind its direct endpoint, defaults."""
    srv = fresh_server
    async with httpx.AsyncClient(base_url=srv.url, timeout=120,
                                 headers={"OPEN-SANDBOX-API-KEY": srv.api_key}) as c:
        _, endpoint, _ = await running_sandbox(c, {
            "image": {"uri": "base"}, "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600, "resourceLimits": {"cpu": "250m", "memory": "256Mi"}})
    host, _, port = endpoint.rpartition(":")
    api_reader, api_writer = await asyncio.open_connection("127.0.0.1", srv.port)
    ep_reader, ep_writer = await asyncio.open_connection(host, int(port))
    api_closed, ep_closed = await asyncio.gather(
        _closed_by_server(api_reader, 60), _closed_by_server(ep_reader, 60))
    assert api_closed, "the API server kept a silent connection"
    assert ep_closed, "execd (through the direct endpoint) kept a silent connection"
    api_writer.close()
    ep_writer.close()
