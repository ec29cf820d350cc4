"""Direct endpoints hand a connection to the sandbox whole when the runtime takes it
(``Runtime.hand_off``), relay it when the runtime cannot take it now, and hold it for a
sandbox still starting before handing it over. The sandbox side here is a receiver that
serves what it gets like execd does (``loop.connect_accepted_socket``)."""

from __future__ import annotations

import asyncio
import os
import socket

from sandlot.server.endpoints import EndpointForwarder
from tests.server.fakes import connect_loopback


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"sandbox:" + data)  # type: ignore[attr-defined]


class _Sandbox:
    """Takes handed-over descriptors over a socketpair and echoes on them."""

    def __init__(self) -> None:
        self.host_end, self.sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sandbox_end.setblocking(False)
        self.taken = 0
        asyncio.get_running_loop().add_reader(self.sandbox_end.fileno(), self._take)

    def hand_off(self, sandbox_id: str, port: int, conn: socket.socket) -> bool:
        socket.send_fds(self.host_end, [b"c"], [conn.fileno()])
        return True

    def _take(self) -> None:
        _, fds, _, _ = socket.recv_fds(self.sandbox_end, 16, 1)
        for fd in fds:
            self.taken += 1
            sock = socket.socket(fileno=fd)
            sock.setblocking(False)
            asyncio.get_running_loop().create_task(
                asyncio.get_running_loop().connect_accepted_socket(_Echo, sock))

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sandbox_end.fileno())
        self.host_end.close()
        self.sandbox_end.close()


async def _never(sandbox_id: str, port: int) -> socket.socket:
    raise AssertionError("a handed-over connection must not be connected inside")


async def _ask(port: int, line: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(line)
    await w.drain()
    try:
        return await asyncio.wait_for(r.readuntil(line), 10)
    finally:
        w.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_handed_over_connection_is_served_by_the_sandbox_and_not_held_here() -> None:
    sandbox = _Sandbox()
    fwd = EndpointForwarder("127.0.0.1", _never, hand_off=sandbox.hand_off)
    try:
        local = await fwd.open("sb", 44772)
        before = _open_fds()
        for i in range(3):
            assert await _ask(local, f"ping {i}\n".encode()) == f"sandbox:ping {i}\n".encode()
        assert sandbox.taken == 3 and fwd.handed_off.n == 3
        assert fwd.bytes_in.n == fwd.bytes_out.n == 0  # nothing went through the server
        await asyncio.sleep(0.1)
        assert _open_fds() <= before  # the server kept no copy of any of them
    finally:
        await fwd.close()
        sandbox.close()


async def test_a_connection_the_runtime_cannot_take_now_is_relayed() -> None:
    """An execd from before hand-overs (nothing bound): refused, so relayed as before."""
    server = await asyncio.start_server(
        lambda r, w: _echo_line(r, w), "127.0.0.1", 0)
    upstream = int(server.sockets[0].getsockname()[1])
    refused = 0

    def hand_off(sandbox_id: str, port: int, conn: socket.socket) -> bool:
        nonlocal refused
        refused += 1
        raise ConnectionRefusedError("nothing bound there")

    async def connect(sandbox_id: str, port: int) -> socket.socket:
        return await connect_loopback(upstream)

    fwd = EndpointForwarder("127.0.0.1", connect, hand_off=hand_off)
    try:
        local = await fwd.open("sb", 44772)
        assert await _ask(local, b"ping\n") == b"relayed:ping\n"
        assert refused >= 1 and fwd.handed_off.n == 0
        assert fwd.bytes_in.n == len(b"ping\n")
    finally:
        await fwd.close()
        server.close()


async def _echo_line(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"relayed:" + await r.readline())
    await w.drain()
    w.close()


async def test_a_connection_to_a_starting_sandbox_is_handed_over_once_it_started() -> None:
    sandbox = _Sandbox()
    start: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tried = 0

    def hand_off(sandbox_id: str, port: int, conn: socket.socket) -> bool:
        nonlocal tried
        tried += 1
        return sandbox.hand_off(sandbox_id, port, conn)

    fwd = EndpointForwarder("127.0.0.1", _never, hand_off=hand_off,
                            start_of=lambda sid: None if start.done() else start)
    try:
        local = await fwd.open("sb", 44772)
        asking = asyncio.create_task(_ask(local, b"ping\n"))
        await asyncio.sleep(0.3)
        assert tried == 0 and not asking.done()  # held, not handed to a sandbox not up yet
        start.set_result(None)
        assert await asking == b"sandbox:ping\n"
        assert tried == 1 and fwd.handed_off.n == 1
    finally:
        await fwd.close()
        sandbox.close()
