"""Direct endpoints hold a client that dials while the sandbox is still starting."""

from __future__ import annotations

import asyncio

from sandlot.server.endpoints import EndpointForwarder
from tests.server.fakes import connect_loopback


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(await r.readline())
        await w.drain()
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def test_connection_waits_for_a_late_upstream() -> None:
    server, port = await _echo_server()
    attempts = 0

    async def connect(sandbox_id: str, _port: int):  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        if attempts < 4:  # execd not listening yet
            raise FileNotFoundError("no socket yet")
        return await connect_loopback(port)

    fwd = EndpointForwarder("127.0.0.1", connect, connect_grace=5.0)
    try:
        local = await fwd.open("sb", 44772)
        r, w = await asyncio.open_connection("127.0.0.1", local)
        w.write(b"ping\n")
        await w.drain()
        assert await asyncio.wait_for(r.readline(), 10) == b"ping\n"
        assert attempts == 4
        w.close()
    finally:
        await fwd.close()
        server.close()


async def test_connection_closes_when_nothing_comes_up_in_time() -> None:
    async def connect(sandbox_id: str, _port: int):  # type: ignore[no-untyped-def]
        raise ConnectionRefusedError("nothing listens")

    fwd = EndpointForwarder("127.0.0.1", connect, connect_grace=0.2)
    try:
        local = await fwd.open("sb", 8000)
        r, w = await asyncio.open_connection("127.0.0.1", local)
        assert await asyncio.wait_for(r.read(), 10) == b""
        w.close()
    finally:
        await fwd.close()


async def test_connection_to_a_starting_sandbox_waits_for_its_start() -> None:
    """A sandbox answered Pending (queued for a start slot in a burst) is not dialed until
    its start ends, however long past the grace that is; then the client is served at once
    (before: an EOF after the grace, and the SDK's back-off on top)."""
    server, port = await _echo_server()
    attempts = 0
    start: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def connect(sandbox_id: str, _port: int):  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        if not start.done():
            raise FileNotFoundError("not started yet")
        return await connect_loopback(port)

    fwd = EndpointForwarder("127.0.0.1", connect, connect_grace=0.1,
                            start_of=lambda sid: start if sid == "sb" and not start.done()
                            else None)
    try:
        local = await fwd.open("sb", 44772)
        r, w = await asyncio.open_connection("127.0.0.1", local)
        w.write(b"ping\n")
        await w.drain()
        await asyncio.sleep(0.5)  # five graces
        assert attempts == 0
        start.set_result(None)
        assert await asyncio.wait_for(r.readline(), 10) == b"ping\n"
        assert attempts == 1
        w.close()
    finally:
        await fwd.close()
        server.close()
