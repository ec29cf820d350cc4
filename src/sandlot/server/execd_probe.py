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


async def ping_once(socket_path: Path, token: str | None, timeout: float = 2.0) -> int:
    """One ``GET /ping`` over the unix socket; returns the HTTP status.

    Written against the socket directly (not httpx) because it sits on every create's path:
    building an HTTP client costs more than this one-line request and its status line.
    """
    auth = f"{EXECD_TOKEN_HEADER}: {token}\r\n" if token else ""
    request = f"GET /ping HTTP/1.1\r\nHost: execd\r\n{auth}Connection: close\r\n\r\n"
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(request.encode())
            status_line = await reader.readline()
        finally:
            writer.close()
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    return int(parts[1])


async def wait_for_execd(
    socket_path: Path, token: str | None, timeout: float, interval: float = 0.005
) -> None:
    """Return once execd answers 200 on ``/ping``; raise TimeoutError with the last error."""
    deadline = time.monotonic() + timeout
    last: str = "socket never appeared"
    while True:
        if socket_path.exists():
            try:
                status = await ping_once(socket_path, token)
                if status == 200:
                    return
                last = f"/ping answered HTTP {status}"
            except (OSError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"execd did not answer /ping within {timeout:.0f}s ({last})")
        await asyncio.sleep(interval)
        # Back off gently: fast while a sandbox starts, cheap if it is slow.
        interval = min(interval * 1.2, 0.1)
