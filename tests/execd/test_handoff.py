"""Connections handed to execd as descriptors (``sandlot.execd.handoff``), on real sockets:
a TCP connection accepted elsewhere is served by execd's HTTP layer as its own, arrives
close-on-exec (no command execd starts inherits it), and anything that is not a stream
socket is closed without stopping the receiver."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import uuid
from typing import Any

from sandlot.execd.handoff import HandoffReceiver, bind_receiver
from sandlot.execd.httpserver import HttpServer
from tests.asgi_lifespan import answer_lifespan


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    body = f"{scope['method']} {scope['path']}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _send(address: bytes, fd: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as carrier:
        carrier.connect(address)
        socket.send_fds(carrier, [b"c"], [fd])


async def _accepted_pair() -> tuple[socket.socket, socket.socket]:
    """(client, the server side accepted elsewhere) of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    return client, accepted


async def _get(client: socket.socket, path: str) -> bytes:
    loop = asyncio.get_running_loop()
    client.setblocking(False)
    await loop.sock_sendall(client, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = b""
    async with asyncio.timeout(10):
        while not answer.endswith(f"GET {path}".encode()):
            chunk = await loop.sock_recv(client, 65536)
            assert chunk, f"closed after {answer!r}"
            answer += chunk
    return answer


async def test_a_handed_over_connection_is_served_close_on_exec_and_junk_is_dropped() -> None:
    address = b"\0sandlot-test-handoff-" + uuid.uuid4().hex.encode()
    server = HttpServer(_app)
    adopted: list[socket.socket] = []

    def adopt(sock: socket.socket) -> None:
        adopted.append(sock)
        server.adopt(sock)

    receiver = HandoffReceiver(bind_receiver(address), adopt)
    serving = asyncio.create_task(server.serve([]))
    await server.started.wait()
    receiver.start()
    try:
        # junk first: a pipe and a UDP socket are closed, the receiver goes on
        read_end, write_end = os.pipe()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _send(address, read_end)
        _send(address, udp.fileno())
        client, accepted = await _accepted_pair()
        _send(address, accepted.fileno())
        accepted.close()  # only execd's copy is left, as after the server's hand-over
        answer = await _get(client, "/ping")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert len(adopted) == 1 and adopted[0].type == socket.SOCK_STREAM
        assert fcntl.fcntl(adopted[0].fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert len(server.connections) == 1
        # the same connection keeps serving (keep-alive), as one execd accepted itself
        assert (await _get(client, "/again")).startswith(b"HTTP/1.1 200")
        client.close()
        async with asyncio.timeout(10):
            while server.connections:
                await asyncio.sleep(0.01)
        os.close(read_end)
        os.close(write_end)
        udp.close()
    finally:
        receiver.close()
        server.request_exit()
        await serving


def test_a_taken_address_is_refused() -> None:
    address = b"\0sandlot-test-handoff-" + uuid.uuid4().hex.encode()
    with bind_receiver(address):
        try:
            bind_receiver(address)
        except OSError:
            return
        raise AssertionError("a second receiver bound the same address")
