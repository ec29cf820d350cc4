"""Direct endpoints: a loopback listener per sandbox port that forwards raw TCP into it.

Clients get ``127.0.0.1:<listener port>``; each accepted connection is joined to a fresh
connection into the sandbox (execd's unix socket, or the runtime's connection to any other
port in the sandbox's network namespace). Ports are persisted so a restarted server offers
the same addresses again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

_CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


class EndpointForwarder:
    def __init__(self, bind_host: str, connect: Connector, connect_grace: float = 2.0):
        self._bind_host = bind_host
        self.connect_grace = connect_grace
        self._connect = connect
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._ports: dict[tuple[str, int], int] = {}
        self._conns: dict[str, set[asyncio.Task[None]]] = {}
        self._lock = asyncio.Lock()

    def port_of(self, sandbox_id: str, port: int) -> int | None:
        return self._ports.get((sandbox_id, port))

    async def open(self, sandbox_id: str, port: int, preferred: int | None = None) -> int:
        """Start (or reuse) the listener; try ``preferred`` first, else any free port."""
        key = (sandbox_id, port)
        async with self._lock:
            if key in self._ports:
                return self._ports[key]

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                # Cancelled by close_sandbox(): a normal end, not an error to report.
                with contextlib.suppress(asyncio.CancelledError):
                    await self._serve(sandbox_id, port, r, w)

            server: asyncio.Server | None = None
            if preferred:
                try:
                    server = await asyncio.start_server(handle, self._bind_host, preferred)
                except OSError:
                    log.warning("port %s for %s:%s is taken; using another", preferred, *key)
            if server is None:
                server = await asyncio.start_server(handle, self._bind_host, 0)
            host_port = int(server.sockets[0].getsockname()[1])
            self._servers[key] = server
            self._ports[key] = host_port
            return host_port

    async def _serve(
        self,
        sandbox_id: str,
        port: int,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        conns = self._conns.setdefault(sandbox_id, set())
        conns.add(task)  # type: ignore[arg-type]
        try:
            upstream = await self._connect_soon(sandbox_id, port)
            if upstream is None:
                return
            up_r, up_w = upstream
            try:
                await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
            finally:
                await _close(up_w)
        finally:
            conns.discard(task)  # type: ignore[arg-type]
            await _close(client_w)

    async def _connect_soon(
        self, sandbox_id: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Connect inside, retrying briefly: a client may dial while the sandbox still starts.

        Closing at once would make clients back off for much longer than execd needs to come
        up (the released SDK waits 0.5 s and more after an early EOF).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_grace
        delay = 0.005
        while True:
            try:
                return await self._connect(sandbox_id, port)
            except Exception as exc:  # the service is not (yet) listening inside
                if loop.time() + delay > deadline:
                    log.debug("endpoint %s:%s not reachable: %s", sandbox_id, port, exc)
                    return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def close_sandbox(self, sandbox_id: str) -> None:
        async with self._lock:
            keys = [k for k in self._servers if k[0] == sandbox_id]
            servers = [self._servers.pop(k) for k in keys]
            for k in keys:
                self._ports.pop(k, None)
        for server in servers:
            server.close()
        tasks = self._conns.pop(sandbox_id, set())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def close(self) -> None:
        for sandbox_id in {k[0] for k in list(self._servers)} | set(self._conns):
            await self.close_sandbox(sandbox_id)
