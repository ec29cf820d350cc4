"""The direct-endpoint relay: bulk data both ways, half-close, early upstream data."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from sandlot.server.endpoints import EndpointForwarder
from tests.server.fakes import connect_loopback


async def test_bulk_both_ways_and_half_close() -> None:
    payload = os.urandom(8 << 20)

    async def sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        # Reads everything (until the client's half-close), answers with its digest and a
        # large reply of its own, then closes.
        digest = hashlib.sha256()
        while data := await r.read(1 << 16):
            digest.update(data)
        w.write(digest.digest() + payload[::-1])
        await w.drain()
        w.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])

    async def connect(sandbox_id: str, _port: int):  # type: ignore[no-untyped-def]
        return await connect_loopback(port)

    fwd = EndpointForwarder("127.0.0.1", connect)
    try:
        local = await fwd.open("sb", 44772)
        r, w = await asyncio.open_connection("127.0.0.1", local)
        w.write(payload)
        await w.drain()
        w.write_eof()
        reply = await asyncio.wait_for(r.read(), 60)
        assert reply[:32] == hashlib.sha256(payload).digest()
        assert reply[32:] == payload[::-1]
        w.close()
    finally:
        await fwd.close()
        server.close()


async def test_upstream_speaks_first() -> None:
    async def banner(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"hello\n")
        await w.drain()
        w.write((await r.readline()).upper())
        await w.drain()
        w.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])

    async def connect(sandbox_id: str, _port: int):  # type: ignore[no-untyped-def]
        sock = await connect_loopback(port)
        await asyncio.sleep(0.05)  # the banner has arrived before the relay starts
        return sock

    fwd = EndpointForwarder("127.0.0.1", connect)
    try:
        local = await fwd.open("sb", 22)
        r, w = await asyncio.open_connection("127.0.0.1", local)
        assert await asyncio.wait_for(r.readline(), 10) == b"hello\n"
        w.write(b"abc\n")
        await w.drain()
        assert await asyncio.wait_for(r.readline(), 10) == b"ABC\n"
        assert await asyncio.wait_for(r.read(), 10) == b""
        w.close()
    finally:
        await fwd.close()
        server.close()


def test_relay_on_uvloop() -> None:
    """The server runs on uvloop, whose transports are not asyncio.Transport subclasses."""
    uvloop = pytest.importorskip("uvloop")

    async def both() -> None:
        await test_bulk_both_ways_and_half_close()
        await test_upstream_speaks_first()

    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        runner.run(both())
    finally:
        runner.close()
