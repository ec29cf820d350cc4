"""Readiness probe: poll execd's ``/ping`` over the sandbox's unix socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

EXECD_TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


def unix_socket_client(
    socket_path: Path | str, timeout: float | httpx.Timeout
) -> httpx.AsyncClient:
    """An HTTP client over a local unix socket.

    No TLS and no proxies ever apply there, so neither is set up: loading the CA bundle for
    an unused SSL context costs tens of ms, which would dominate a warm create.
    """
    transport = httpx.AsyncHTTPTransport(uds=str(socket_path), verify=False)
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)


async def wait_for_execd(
    socket_path: Path, token: str | None, timeout: float, interval: float = 0.005
) -> None:
    """Return once execd answers 200 on ``/ping``; raise TimeoutError with the last error."""
    headers = {EXECD_TOKEN_HEADER: token} if token else {}
    deadline = time.monotonic() + timeout
    last: str = "socket never appeared"
    async with unix_socket_client(socket_path, timeout=2.0) as client:
        while True:
            if socket_path.exists():
                try:
                    resp = await client.get("http://execd/ping", headers=headers)
                    if resp.status_code == 200:
                        return
                    last = f"/ping answered HTTP {resp.status_code}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise TimeoutError(f"execd did not answer /ping within {timeout:.0f}s ({last})")
            await asyncio.sleep(interval)
            # Back off gently: fast while a sandbox starts, cheap if it is slow.
            interval = min(interval * 1.2, 0.1)
