"""The execd client (probe, ping, claim) speaks enough HTTP to a real server over a socket
from a connect callable, the way the server reaches execd through a runtime."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from sandlot.runtime import execd_client


async def _serve(status: int, need_token: str | None, seen: list[str]) -> asyncio.Server:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        length = next((int(ln.split(":")[1]) for ln in head.split("\r\n")
                       if ln.lower().startswith("content-length:")), 0)
        body = (await r.readexactly(length)).decode() if length else ""
        seen.append(head + body)
        ok = need_token is None or f"{execd_client.TOKEN_HEADER}: {need_token}" in head
        code = status if ok else 401
        w.write(f"HTTP/1.1 {code} X\r\nContent-Length: 2\r\n\r\nok".encode())
        await w.drain()
        w.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _connector(server: asyncio.Server) -> execd_client.Connect:
    port = server.sockets[0].getsockname()[1]

    async def connect() -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock

    return connect


async def test_ping_sends_the_token_and_reads_the_status() -> None:
    seen: list[str] = []
    server = await _serve(200, "tok", seen)
    try:
        connect = _connector(server)
        assert await execd_client.ping(connect, "tok") == 200
        assert await execd_client.ping(connect, "wrong") == 401
        await execd_client.wait_ready(connect, "tok", timeout=5)
        assert seen[0].startswith(f"GET {execd_client.PING_PATH} HTTP/1.1")
    finally:
        server.close()


async def test_claim_posts_env_token_and_entrypoint_with_the_pool_token() -> None:
    seen: list[str] = []
    server = await _serve(200, "pool", seen)
    try:
        await execd_client.claim(_connector(server), "pool", env={"A": "1"}, token="t",
                                 entrypoint=["sleep", "1"])
        head, _, body = seen[0].partition("\r\n\r\n")
        assert head.startswith(f"POST {execd_client.CLAIM_PATH} ")
        assert json.loads(body) == {"env": {"A": "1"}, "token": "t", "entrypoint": ["sleep", "1"]}
    finally:
        server.close()


async def test_wait_times_out_with_the_last_answer() -> None:
    server = await _serve(503, None, [])
    try:
        with pytest.raises(TimeoutError, match="HTTP 503"):
            await execd_client.wait_ready(_connector(server), None, timeout=0.3)
    finally:
        server.close()


async def test_wait_reports_a_refused_connection() -> None:
    async def refused() -> socket.socket:
        raise ConnectionRefusedError("nothing listens")

    with pytest.raises(TimeoutError, match="ConnectionRefusedError"):
        await execd_client.wait_ready(refused, None, timeout=0.1)
