"""Sandboxes through the released ``opensandbox`` SDK, every one tracked for cleanup.

Each sandbox gets its own HTTP transport, built the way the SDK builds its own (retries
included), but all of them over one SSL context: left to itself the SDK makes a transport per
``Sandbox.create`` and httpx loads the CA bundle into a new SSL context for each (~20 ms of
client CPU on the 2-core VM), which would be charged to the server's create latency. (One
transport shared by all sandboxes is no better: its pool scans every idle connection, to
every sandbox, on each request.) ``per_sandbox_transport=True`` measures the SDK default.

Each sandbox is created with metadata ``sandlot-bench=<run id>``; ``sweep`` lists the server
and deletes whatever is left (interrupted creates included), so no run leaves a sandbox behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from datetime import timedelta
from typing import Any

import httpx
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.transport import RetryAsyncTransport

from bench.server import SandlotServer

METADATA_KEY = "sandlot-bench"
POLL = timedelta(milliseconds=5)  # readiness polling; the SDK's default 200 ms would dominate
LIFETIME = timedelta(minutes=30)  # a sandbox a crashed run leaves behind expires by itself


class Sandboxes:
    def __init__(self, server: SandlotServer, run_id: str):
        self.server = server
        self.run_id = run_id
        self.live: dict[str, Sandbox] = {}
        self._ssl: ssl.SSLContext | None = None
        self._transports: list[httpx.AsyncBaseTransport] = []
        self._by_sandbox: dict[str, httpx.AsyncBaseTransport] = {}

    def config(self, *, proxy: bool = False, shared: bool = True) -> ConnectionConfig:
        """Connection settings; ``shared``: over the run's one SSL context (see above)."""
        fields: dict[str, Any] = dict(
            domain=self.server.domain, api_key=self.server.api_key, use_server_proxy=proxy,
            disable_metrics=True, request_timeout=timedelta(seconds=300),
        )
        if shared:
            fields["transport"] = self._new_transport(ConnectionConfig(**fields))
        return ConnectionConfig(**fields)

    def _new_transport(self, base: ConnectionConfig) -> httpx.AsyncBaseTransport:
        """The stack ``new_owned_transport`` builds, over one SSL context for the whole run."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        inner = httpx.AsyncHTTPTransport(
            verify=self._ssl,
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                keepalive_expiry=30.0),
        )
        transport: httpx.AsyncBaseTransport = (
            RetryAsyncTransport(inner, base.retry_policy, owns_inner=True)
            if base.retry_policy.wraps_transport() else inner
        )
        self._transports.append(transport)
        return transport

    async def _close_transport(self, sandbox: Sandbox) -> None:
        transport = self._by_sandbox.pop(sandbox.id, None)
        if transport is not None:
            with contextlib.suppress(ValueError):
                self._transports.remove(transport)
            with contextlib.suppress(Exception):
                await transport.aclose()

    async def aclose(self) -> None:
        """Close the transports this object made (the SDK does not close given ones)."""
        transports, self._transports = self._transports, []
        for transport in transports:
            with contextlib.suppress(Exception):
                await transport.aclose()

    async def create(self, image: str | None = "base", *, ready_timeout: float = 60.0,
                     proxy: bool = False, per_sandbox_transport: bool = False,
                     **kwargs: Any) -> tuple[Sandbox, float]:
        """Create and wait until execd answers ``/ping``; (sandbox, seconds)."""
        config = self.config(proxy=proxy, shared=not per_sandbox_transport)
        t0 = time.perf_counter()
        sandbox = await Sandbox.create(
            image, connection_config=config, timeout=LIFETIME,
            ready_timeout=timedelta(seconds=ready_timeout), health_check_polling_interval=POLL,
            metadata={METADATA_KEY: self.run_id}, **kwargs,
        )
        elapsed = time.perf_counter() - t0
        self.live[sandbox.id] = sandbox
        if config.transport is not None and not per_sandbox_transport:
            self._by_sandbox[sandbox.id] = config.transport
        return sandbox, elapsed

    async def connect(self, sandbox_id: str, *, proxy: bool) -> Sandbox:
        return await Sandbox.connect(sandbox_id, connection_config=self.config(proxy=proxy),
                                     health_check_polling_interval=POLL)

    async def delete(self, sandbox: Sandbox) -> float:
        """``kill()`` (DELETE /sandboxes/{id}); seconds until the server answered."""
        t0 = time.perf_counter()
        try:
            await sandbox.kill()
            return time.perf_counter() - t0
        finally:
            self.live.pop(sandbox.id, None)
            await self._close_transport(sandbox)
            with contextlib.suppress(Exception):
                await sandbox.close()

    async def delete_all(self, concurrency: int = 8) -> list[float]:
        sem = asyncio.Semaphore(concurrency)

        async def one(sb: Sandbox) -> float | None:
            async with sem:
                try:
                    return await self.delete(sb)
                except Exception:  # noqa: BLE001 - the sweep catches what is left
                    return None

        done = await asyncio.gather(*(one(sb) for sb in list(self.live.values())))
        return [d for d in done if d is not None]

    async def shut_down(self) -> None:
        """End of a benchmark's private server: delete what it made (through the SDK, then a
        sweep of what is left), close the transports, stop the server and remove its data."""
        try:
            await self.delete_all()
            await asyncio.to_thread(self.sweep)
        finally:  # the server is stopped and its data removed even when the sweep failed
            await self.aclose()
            await asyncio.to_thread(self.server.stop)
            self.server.remove()

    def sweep(self, timeout: float = 120.0) -> list[str]:
        """Delete every sandbox the server still has that is not Terminated (sync, no SDK).

        A server that never started or has exited has nothing to sweep: its failure is what
        the caller reports, not a connection error from here."""
        deleted: list[str] = []
        proc = self.server.proc
        if proc is None or proc.poll() is not None:
            return deleted
        headers = {"OPEN-SANDBOX-API-KEY": self.server.api_key}
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=f"{self.server.base_url}/v1", headers=headers,
                          timeout=60.0) as client:
            for _ in range(5):  # a delete may race a create that was still finishing
                try:
                    ids = _list_ids(client)
                except httpx.TransportError as exc:
                    raise RuntimeError(
                        f"sweep: the server (pid {proc.pid}, running: {proc.poll() is None}) "
                        f"did not answer at {self.server.base_url}: {type(exc).__name__}: "
                        f"{exc}; its log: {self.server.log_tail(8)}") from exc
                ids = [i for i in ids if i not in deleted]
                if not ids or time.monotonic() > deadline:
                    break
                for sandbox_id in ids:
                    with contextlib.suppress(httpx.HTTPError):
                        r = client.delete(f"/sandboxes/{sandbox_id}")
                        if r.status_code < 300 or r.status_code == 404:
                            deleted.append(sandbox_id)
        for sandbox_id in deleted:
            self.live.pop(sandbox_id, None)
        return deleted


def _list_ids(client: httpx.Client) -> list[str]:
    ids: list[str] = []
    for page in range(1, 100):
        r = client.get("/sandboxes", params={"page": page, "pageSize": 100})
        if r.status_code != 200:
            break
        body = r.json()
        for item in body.get("items", []):
            state = (item.get("status") or {}).get("state")
            if state not in ("Terminated", "Stopping"):
                ids.append(item["id"])
        if not (body.get("pagination") or {}).get("hasNextPage"):
            break
    return ids
