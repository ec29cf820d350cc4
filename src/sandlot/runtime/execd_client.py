"""The host's small execd client: readiness probe, ``/ping`` and the warm-pool claim.

It speaks over a socket from a ``Connect`` callable (a runtime's ``connect`` bound to a
sandbox and execd's port), never over a path. The requests are written by hand on purpose:
they sit on every create's path, where building an HTTP client costs more than the one
request line and the status line read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable

from sandlot.execd.protocol import CLAIM_PATH, DEFAULT_PORT, PING_PATH, TOKEN_HEADER

Connect = Callable[[], Awaitable[socket.socket]]
Ended = Callable[[], Awaitable[str | None]]  # why the sandbox is gone, or None

__all__ = ["CLAIM_PATH", "DEFAULT_PORT", "PING_PATH", "TOKEN_HEADER", "Connect", "Ended",
           "ExecdEnded", "claim", "ping", "request", "wait_ready"]


async def request(
    connect: Connect, method: str, path: str, *, token: str | None = None,
    body: bytes | None = None, timeout: float = 2.0, read_body: bool = True,
    headers: dict[str, str] | None = None, max_body: int | None = None,
) -> tuple[int, bytes]:
    """One HTTP/1.1 request; returns the status and the body.

    The host closes the connection once it has the answer (``Content-Length`` bytes), not
    execd: the side that closes first keeps the connection in TIME_WAIT, and under gVisor
    that side is the sandbox's netstack, which cannot be checkpointed with such a socket.
    """
    head = [f"{method} {path} HTTP/1.1", "Host: execd"]
    if token:
        head.append(f"{TOKEN_HEADER}: {token}")
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    async with asyncio.timeout(timeout):
        sock = await connect()
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
            raw = (await _read_answer(reader, max_body) if read_body
                   else await reader.readline())
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    status_line, _, rest = raw.partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"execd answered no HTTP status: {raw[:100]!r}")
    return int(parts[1]), rest.partition(b"\r\n\r\n")[2]


async def _read_answer(reader: asyncio.StreamReader, max_body: int | None = None) -> bytes:
    """Status line, headers and a ``Content-Length`` body (or up to EOF without one).

    ``max_body`` bounds what is read: the answer comes from inside an untrusted sandbox.
    """
    head = await reader.readuntil(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
    if max_body is not None and length is not None and length > max_body:
        raise ConnectionError(f"execd's answer is larger than {max_body} bytes")
    if length is not None:
        return head + await reader.readexactly(length)
    if max_body is None:
        return head + await reader.read()
    body = b""
    while len(body) <= max_body:
        chunk = await reader.read(65536)
        if not chunk:
            return head + body
        body += chunk
    raise ConnectionError(f"execd's answer is larger than {max_body} bytes")


async def ping(connect: Connect, token: str | None = None, timeout: float = 2.0) -> int:
    """``GET /ping``; returns the HTTP status (200 once execd serves)."""
    status, _ = await request(connect, "GET", PING_PATH, token=token, timeout=timeout,
                              read_body=False)
    return status


class ExecdEnded(ConnectionError):
    """The sandbox ended (its execd with it) before execd answered: waiting longer is moot."""


async def wait_ready(
    connect: Connect, token: str | None, timeout: float, interval: float = 0.005,
    ended: Ended | None = None, check_every: float = 0.5,
) -> None:
    """Return once execd answers 200 on ``/ping``; raise TimeoutError with the last error.

    ``ended`` (asked every ``check_every`` seconds while execd does not answer) says why the
    sandbox is gone, or None while it runs: then ``ExecdEnded`` is raised at once.
    """
    start = time.monotonic()
    deadline = start + timeout
    next_check = start + check_every
    last = "never reached"
    while True:
        try:
            status = await ping(connect, token)
            if status == 200:
                return
            last = f"/ping answered HTTP {status}"
        except (OSError, TimeoutError, ConnectionError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if ended is not None and now >= next_check:
            why = await ended()
            if why is not None:
                raise ExecdEnded(f"{why} {now - start:.1f}s into the wait for execd ({last})")
            next_check = time.monotonic() + check_every
        if now >= deadline:
            raise TimeoutError(f"execd did not answer /ping within {timeout:.0f}s ({last})")
        await asyncio.sleep(interval)
        # Back off gently: fast while a sandbox starts, cheap if it is slow.
        interval = min(interval * 1.2, 0.1)


async def claim(
    connect: Connect, pool_token: str, *, env: dict[str, str], token: str | None,
    entrypoint: list[str], timeout: float = 5.0,
) -> None:
    """Hand a warm execd its sandbox: environment, access token, entrypoint."""
    body = json.dumps({"env": env, "token": token, "entrypoint": entrypoint}).encode()
    status, answer = await request(connect, "POST", CLAIM_PATH, token=pool_token, body=body,
                                   timeout=timeout)
    if status != 200:
        raise ConnectionError(f"execd refused the claim: HTTP {status} {answer[:200]!r}")
