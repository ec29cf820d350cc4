"""An httpx transport whose connections are sockets from the runtime's ``connect``.

The server proxy speaks HTTP to any port of a sandbox; the connection itself must come from
the runtime boundary (no host path, no loopback listener in between). httpcore's connection
pool takes a network backend for exactly this; this module adapts a ``connect(port)`` to it
and the pool to httpx's transport interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import httpcore
import httpx

PortConnect = Callable[[int], Awaitable[socket.socket]]

# httpcore's errors -> httpx's (what httpx's own transport raises for them).
_ERRORS: list[tuple[type[Exception], type[httpx.TransportError]]] = [
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.NetworkError, httpx.NetworkError),
]


@contextlib.contextmanager
def _mapped() -> Any:
    try:
        yield
    except Exception as exc:
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc)) from exc
        raise


class _SocketStream(httpcore.AsyncNetworkStream):
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.get_running_loop().sock_recv(self._sock, max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().sock_sendall(self._sock, buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._sock.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":  # the pool asks before reusing an idle connection
            if self._sock.fileno() < 0:
                return True
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            return bool(poller.poll(0))
        return None


class _SandboxBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, connect: PortConnect) -> None:
        self._connect = connect

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                sock = await self._connect(port)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting to port {port} timed out") from exc
        except Exception as exc:  # refused, sandbox gone (NotFound), ...
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _SocketStream(sock)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        if hasattr(self._stream, "aclose"):
            await self._stream.aclose()


class SandboxTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to ``http://<any host>:<port>/...``, connected through ``connect(port)``."""

    def __init__(self, connect: PortConnect, *, max_connections: int = 1024,
                 keepalive_expiry: float = 20.0) -> None:
        # Idle connections are dropped before execd's own keep-alive timeout (75 s) closes
        # them: reusing one as execd closes it would fail the request. Every connection may
        # be kept (max_keepalive_connections = max_connections): httpcore 1.0 closes "surplus"
        # idle connections outside its lock, after it may have handed them to a request.
        self._pool = httpcore.AsyncConnectionPool(
            network_backend=_SandboxBackend(connect), max_connections=max_connections,
            max_keepalive_connections=max_connections, keepalive_expiry=keepalive_expiry)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host,
                             port=request.url.port, target=request.url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _mapped():
            response = await self._pool.handle_async_request(core_request)
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_ResponseStream(response.stream),
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()
