"""execd's own HTTP layer (``sandlot.execd.httpserver``) on real sockets: keep-alive,
pipelining, unread bodies, errors, the slow-client deadlines (as ``http_deadlines`` gives
uvicorn), WebSocket accept/deny/echo, and listeners closed and re-opened (hibernation)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from sandlot.execd.httpserver import HttpServer
from tests.asgi_lifespan import answer_lifespan

HEADER, BODY_IDLE, KEEP_ALIVE = 0.6, 0.6, 1.0
CLOSE_WITHIN = 15.0  # far beyond every deadline: a connection still open after it was not cut


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    if scope["type"] == "websocket":
        await _ws_app(scope, receive, send)
        return
    path = scope["path"]
    if path == "/boom":
        raise RuntimeError("boom")
    size = 0
    if path != "/unread":
        while True:
            msg = await receive()
            size += len(msg.get("body", b""))
            if not msg.get("more_body"):
                break
    body = f"{scope['method']} {path} {size}".encode()
    if path == "/pieces":  # a chunked stream of small and large pieces (large: unjoined writes)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in _PIECES:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/quiet":  # says nothing for longer than the deadlines
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await asyncio.sleep(3 * max(HEADER, BODY_IDLE))
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/steps":  # a stream: a head and a chunk, then later the last chunk
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b"second", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


_PIECES = [b"a" * 10, bytes(range(256)) * (3 << 12), b"b" * 70_000, b"c", b"d" * (1 << 20)]


async def _ws_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert (await receive())["type"] == "websocket.connect"
    if scope["path"] == "/deny":
        await send({"type": "websocket.http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "websocket.http.response.body", "body": b'{"code":"NOT_FOUND"}'})
        return
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("text") == "bye":
            await send({"type": "websocket.close", "code": 4000, "reason": "bye"})
            return
        if msg.get("bytes") is not None:
            await send({"type": "websocket.send", "bytes": msg["bytes"][::-1]})
        else:
            await send({"type": "websocket.send", "text": msg["text"].upper()})


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[tuple[HttpServer, int]]:
    server = HttpServer(_app, header_timeout=HEADER, body_idle_timeout=BODY_IDLE,
                        keep_alive_timeout=KEEP_ALIVE)
    sock = _listener()
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve([sock]))
    await asyncio.wait_for(server.started.wait(), 10)
    try:
        yield server, port
    finally:
        server.request_exit()
        await asyncio.wait_for(task, 10)
        assert not server.connections


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, int]]:
    async with _serving() as found:
        yield found


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float = CLOSE_WITHIN) -> bool:
    try:
        while True:
            if not await asyncio.wait_for(reader.read(4096), timeout):
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_requests_on_one_kept_alive_connection(served: tuple[HttpServer, int]) -> None:
    server, port = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                 limits=httpx.Limits(max_connections=1)) as c:
        for i in range(5):
            r = await c.post(f"/echo/{i}", content=b"x" * (i * 100_000))
            assert r.status_code == 200 and r.text == f"POST /echo/{i} {i * 100_000}"
            assert "date" in r.headers
        assert len(server.connections) == 1  # one connection served them all
        r = await c.head("/echo")
        assert r.status_code == 200 and r.content == b""
        r = await c.post("/unread", content=b"y" * 1000)  # the app never reads the body
        assert r.text == "POST /unread 0"
        r = await c.get("/after")  # ... and the connection goes on
        assert r.text == "GET /after 0"
        r = await c.get("/boom")
        assert r.status_code == 500 and r.text == "Internal Server Error"
    await asyncio.sleep(0.2)
    assert not server.connections


async def test_a_stream_of_large_and_small_pieces_arrives_intact(
    served: tuple[HttpServer, int],
) -> None:
    _, port = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        r = await c.get("/pieces")
        assert r.headers["transfer-encoding"] == "chunked"
        assert r.content == b"".join(_PIECES)
        r = await c.get("/after")  # the connection is still in step
        assert r.text == "GET /after 0"


async def test_pipelined_requests_are_answered_in_order(
    served: tuple[HttpServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                 b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), CLOSE_WITHIN)
    assert data.count(b"HTTP/1.1 200") == 3, data
    assert data.index(b"GET /a 0") < data.index(b"POST /b 3") < data.index(b"GET /c 0")
    writer.close()


async def test_a_malformed_request_gets_400_and_is_closed(served: tuple[HttpServer, int]) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), CLOSE_WITHIN)
    assert data.startswith(b"HTTP/1.1 400"), data
    writer.close()


async def test_a_silent_connection_and_a_trickled_head_are_cut(
    served: tuple[HttpServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await _closed_by_server(reader)
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with contextlib.suppress(ConnectionError):
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n":  # slower than the header deadline
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
    assert await _closed_by_server(reader, 1.0)
    writer.close()


async def test_a_stalled_body_is_cut_and_a_moving_one_is_not(
    served: tuple[HttpServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    await writer.drain()
    assert await _closed_by_server(reader)  # 90 bytes never come
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
    for _ in range(20):  # longer in all than either deadline, never idle that long
        writer.write(b"y")
        await writer.drain()
        await asyncio.sleep(0.2)
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WITHIN)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert await reader.readexactly(len(b"POST / 20")) == b"POST / 20"
    writer.close()


async def test_quiet_responses_are_not_cut_and_idle_kept_alive_ones_are(
    served: tuple[HttpServer, int],
) -> None:
    server, port = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        r = await c.get("/quiet")
        assert r.status_code == 200 and r.text == "aGET /quiet 0"
        await asyncio.sleep(KEEP_ALIVE / 2)
        r = await c.post("/", content=b"z" * 5)
        assert r.text == "POST / 5"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"GET / 0")
    assert await _closed_by_server(reader)  # idle past keep_alive_timeout
    writer.close()


async def test_websocket_echo_close_and_denial(served: tuple[HttpServer, int]) -> None:
    _, port = served
    async with connect(f"ws://127.0.0.1:{port}/echo") as ws:
        await ws.send("hello")
        assert await ws.recv() == "HELLO"
        await ws.send(b"\x01\x02\x03")
        assert await ws.recv() == b"\x03\x02\x01"
        big = b"z" * 300_000  # several TCP reads, one message
        await ws.send(big)
        assert await ws.recv() == big
        await ws.send("bye")
        with pytest.raises(Exception):  # noqa: B017,PT011 - closed by the server
            await ws.recv()
        assert ws.close_code == 4000 and ws.close_reason == "bye"
    with pytest.raises(InvalidStatus) as denied:
        async with connect(f"ws://127.0.0.1:{port}/deny"):
            pass
    assert denied.value.response.status_code == 404
    assert denied.value.response.body == b'{"code":"NOT_FOUND"}'


async def test_listeners_close_and_reopen_and_connections_reset(
    served: tuple[HttpServer, int],
) -> None:
    server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"GET / 0")
    server.close_listeners()
    server.reset_connections()
    assert await _closed_by_server(reader)
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    sock.setblocking(False)
    await server.listen([sock])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        assert (await c.get("/again")).text == "GET /again 0"


def _read_in_pieces(port: int, request: bytes, end: bytes) -> list[bytes]:
    """What each blocking ``recv`` returned until ``end`` (a thread: the reader waits in
    ``recv`` while the server writes, so separate writes tend to arrive separately)."""
    pieces: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WITHIN) as sock:
        sock.sendall(request)
        while not b"".join(pieces).endswith(end):
            piece = sock.recv(65536)
            if not piece:
                break
            pieces.append(piece)
    return pieces


async def test_what_the_app_sends_in_one_step_leaves_in_one_write(
    served: tuple[HttpServer, int],
) -> None:
    """The head and the first chunk go out together, and the last chunk with the chunked
    end: one send (and one wake-up of the client and of any relay) instead of two each."""
    _, port = served
    pieces = await asyncio.to_thread(
        _read_in_pieces, port, b"GET /steps HTTP/1.1\r\nHost: x\r\n\r\n", b"0\r\n\r\n")
    assert len(pieces) == 2, pieces
    assert pieces[0].startswith(b"HTTP/1.1 200") and pieces[0].endswith(b"5\r\nfirst\r\n")
    assert pieces[1] == b"6\r\nsecond\r\n0\r\n\r\n"


async def test_an_endless_starlette_stream_stops_when_the_client_goes() -> None:
    """Starlette's StreamingResponse learns of the disconnect from receive() (ASGI 2.3)."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    stopped = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"tick\n"
                await asyncio.sleep(0.01)
        finally:
            stopped.set()

    async def route(_request: Any) -> StreamingResponse:
        return StreamingResponse(endless())

    server = HttpServer(Starlette(routes=[Route("/s", route)]))
    sock = _listener()
    task = asyncio.create_task(server.serve([sock]))
    await asyncio.wait_for(server.started.wait(), 10)
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(b"GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"tick\n")
        writer.close()
        await asyncio.wait_for(stopped.wait(), CLOSE_WITHIN)
    finally:
        server.request_exit()
        await asyncio.wait_for(task, 10)


async def test_each_request_gets_a_copy_of_the_lifespan_state() -> None:
    """What the app's start-up stores in the lifespan scope's ``state`` reaches every
    request's scope, each as a shallow copy: a request's own additions stay its own (the
    ASGI lifespan spec; Starlette's ``request.state`` is built on it)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            scope["state"]["started"] = "yes"
            await answer_lifespan(receive, send)
            return
        body = f"{scope['state'].get('started')} {scope['state'].get('seen')}".encode()
        scope["state"]["seen"] = scope["path"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    server = HttpServer(app)
    sock = _listener()
    task = asyncio.create_task(server.serve([sock]))
    await asyncio.wait_for(server.started.wait(), 10)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as c:
            assert [(await c.get(p)).text for p in ("/a", "/b")] == ["yes None", "yes None"]
        assert server.app_state == {"started": "yes"}
    finally:
        server.request_exit()
        await asyncio.wait_for(task, 10)
