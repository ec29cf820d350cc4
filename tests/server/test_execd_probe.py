"""The readiness probe speaks enough HTTP to a real server on a unix socket."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from sandlot.server.execd_probe import ping_once, wait_for_execd


async def _serve(path: Path, status: int, need_token: str | None) -> asyncio.Server:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        ok = need_token is None or f"X-EXECD-ACCESS-TOKEN: {need_token}" in head
        code = status if ok else 401
        w.write(f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n".encode())
        await w.drain()
        w.close()

    return await asyncio.start_unix_server(handle, str(path))


async def test_ping_sends_the_token_and_reads_the_status() -> None:
    with tempfile.TemporaryDirectory() as d:
        sock = Path(d) / "execd.sock"
        server = await _serve(sock, 200, "tok")
        try:
            assert await ping_once(sock, "tok") == 200
            assert await ping_once(sock, "wrong") == 401
            await wait_for_execd(sock, "tok", timeout=5)
        finally:
            server.close()


async def test_wait_times_out_with_the_last_answer() -> None:
    with tempfile.TemporaryDirectory() as d:
        sock = Path(d) / "execd.sock"
        server = await _serve(sock, 503, None)
        try:
            with pytest.raises(TimeoutError, match="HTTP 503"):
                await wait_for_execd(sock, None, timeout=0.3)
        finally:
            server.close()


async def test_wait_reports_a_missing_socket() -> None:
    with pytest.raises(TimeoutError, match="never appeared"):
        await wait_for_execd(Path("/nonexistent/execd.sock"), None, timeout=0.1)
