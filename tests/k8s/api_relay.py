"""A TCP relay from the kit's node address to its API server, for Pods that use the API.

The kit's API server listens on loopback only and the kit has no kube-proxy, so a Pod's
in-cluster client (``KUBERNETES_SERVICE_HOST``) reaches nothing; this relay listens on the Pod
bridge's address on the host (the one address of the host a Pod can route to) and copies bytes
to the API server. TLS stays end to end: the Pod names the server ``kubernetes.default.svc``
(a hostAlias to the bridge address), a name the kit's certificate carries. Hand-written:
socat is not installed and the relay is a dozen lines of asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import yaml


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


@contextlib.contextmanager
def api_relay(kubeconfig: str, listen_ip: str) -> Iterator[int]:
    """Relay listen_ip:<port> to the kubeconfig's API server while inside; yields the port."""
    with open(kubeconfig) as fh:
        server = urlsplit(yaml.safe_load(fh)["clusters"][0]["cluster"]["server"])
    loop = asyncio.new_event_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(server.hostname, server.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    listener = loop.run_until_complete(asyncio.start_server(handle, listen_ip, 0))
    port = int(listener.sockets[0].getsockname()[1])
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        async def stop() -> None:
            listener.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
