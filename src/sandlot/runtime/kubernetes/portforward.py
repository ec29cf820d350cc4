"""Reaching a Pod's port through the API server (``connect_mode = "port-forward"``).

For a server that runs where Pod addresses do not route. Each ``connect`` opens one
port-forward WebSocket (``v4.channel.k8s.io``: channel 0 carries the data, channel 1 the
errors, and each channel's first frame is the port number) and bridges it to one end of a
socket pair, whose other end is the connected socket ``Runtime.connect`` promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.stream import WsApiClient

log = logging.getLogger(__name__)

_DATA, _ERROR = 0, 1
_CHUNK = 64 * 1024


class PortForwarder:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.ws_api = WsApiClient(api.configuration)
        self.core = client.CoreV1Api(self.ws_api)
        self.namespace = namespace
        self._bridges: set[asyncio.Task[None]] = set()

    async def connect(self, pod: str, port: int) -> socket.socket:
        opening: Any = await self.core.connect_get_namespaced_pod_portforward(
            pod, self.namespace, ports=port, _preload_content=False)
        # Without preloading, the client hands back aiohttp's ws_connect request; awaiting
        # it opens the WebSocket.
        ws: Any = await opening
        try:
            await _expect_port_frames(ws)
        except BaseException:
            await ws.close()
            raise
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        task = asyncio.get_running_loop().create_task(_bridge(ws, ours))
        self._bridges.add(task)
        task.add_done_callback(self._bridges.discard)
        return theirs

    async def close(self) -> None:
        for task in list(self._bridges):
            task.cancel()
        await asyncio.gather(*self._bridges, return_exceptions=True)
        await self.ws_api.close()


async def _expect_port_frames(ws: Any) -> None:
    """The API server opens both channels with the port number before any data."""
    seen: set[int] = set()
    while seen != {_DATA, _ERROR}:
        msg = await ws.receive()
        data = msg.data if isinstance(msg.data, bytes) else b""
        if not data:
            raise ConnectionRefusedError(f"port-forward closed: {msg.type} {msg.extra or ''}")
        seen.add(data[0])


async def _bridge(ws: Any, sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)

    async def upstream() -> None:  # the server's writes -> the Pod
        while chunk := await reader.read(_CHUNK):
            await ws.send_bytes(bytes([_DATA]) + chunk)

    async def downstream() -> None:  # the Pod -> the server
        async for msg in ws:
            data = msg.data if isinstance(msg.data, bytes) else b""
            if not data:
                continue
            if data[0] == _DATA:
                writer.write(data[1:])
                await writer.drain()
            elif data[0] == _ERROR and len(data) > 1:
                log.debug("port-forward error: %s", data[1:].decode(errors="replace"))
                break

    tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await ws.close()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
