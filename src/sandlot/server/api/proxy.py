"""Server proxy: ``/sandboxes/{id}/proxy/{port}/...`` forwards HTTP (streamed, so SSE works)
and WebSockets to a port inside the sandbox.

Every port (execd's included) is reached through the runtime's ``connect``: no host path and
no listener in between. The caller's API key is stripped: it must never travel into the
untrusted sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from sandlot.errors import Conflict, InvalidRequest, SandlotError
from sandlot.runtime.execd_client import TOKEN_HEADER
from sandlot.server import codes
from sandlot.server.models import SandboxState
from sandlot.server.sandbox_transport import SandboxTransport
from sandlot.server.service import SandboxService
from sandlot.server.tracing import propagate_into

log = logging.getLogger(__name__)
router = APIRouter()

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "open-sandbox-api-key",
}
_WS_SKIP = _HOP_BY_HOP | {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "content-length",
}
# Largest message relayed from a sandbox's WebSocket (websockets' own default, 1 MiB, would
# close connections carrying e.g. a Jupyter plot); still bounded: the sandbox is untrusted.
_WS_MAX_MESSAGE = 64 << 20
_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)


class UpstreamUnreachable(SandlotError):
    status = 502
    code = "SANDBOX_UNREACHABLE"


class ProxyClients:
    """One pooled HTTP client per sandbox, connecting through the runtime to any port."""

    def __init__(self, svc: SandboxService):
        self.svc = svc
        self._clients: dict[str, httpx.AsyncClient] = {}
        svc.terminate_hooks.append(self.forget)

    def of(self, sandbox_id: str) -> httpx.AsyncClient:
        client = self._clients.get(sandbox_id)
        if client is None:
            svc = self.svc

            async def connect(port: int) -> socket.socket:
                return await svc.connect(sandbox_id, port)

            # No TLS and no proxies ever apply inside: nothing of either is set up (loading
            # a CA bundle costs tens of ms).
            transport = SandboxTransport(
                connect, max_connections=svc.cfg.server.max_connections_per_sandbox)
            client = httpx.AsyncClient(transport=transport, timeout=_TIMEOUT, trust_env=False)
            self._clients[sandbox_id] = client
        return client

    async def forget(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


def _check_reachable(svc: SandboxService, sandbox_id: str) -> None:
    rec = svc.get(sandbox_id)
    if rec.state != SandboxState.RUNNING:
        raise Conflict(
            f"Sandbox is not in a running state (it is {rec.state.value}); the proxy reaches "
            "Running sandboxes only.",
            code=codes.SANDBOX_NOT_RUNNING,
        )


async def _target(request_app: Any, sandbox_id: str, port: int) -> tuple[httpx.AsyncClient, str]:
    svc: SandboxService = request_app.state.service
    clients: ProxyClients = request_app.state.proxy_clients
    _check_reachable(svc, sandbox_id)
    if not 0 < port < 65536:
        raise InvalidRequest(f"port {port} is out of range (1-65535)")
    return clients.of(sandbox_id), f"http://sandbox:{port}"


def rebase_location(location: str, request_path: str, port: int) -> str:
    """A root-relative redirect of the sandbox's service, made relative to this route:
    ``/login`` from port 8000 becomes ``/v1/sandboxes/<id>/proxy/8000/login``."""
    if not location.startswith("/") or location.startswith("//"):
        return location  # absolute, scheme-relative or relative: already right
    marker = f"/proxy/{port}"
    cut = request_path.find(marker)
    if cut < 0:
        return location
    return request_path[: cut + len(marker)] + location


def _add_execd_token(
    svc: SandboxService, sandbox_id: str, port: int, headers: list[tuple[str, str]]
) -> None:
    """The server supplies the execd token the endpoint's ``headers`` name, as the reference's
    proxy merges endpoint headers itself: a caller that passed the API key gate and did not
    send the token still reaches execd (one it did send is kept)."""
    if port != svc.cfg.execd.port:
        return
    if any(k.lower() == TOKEN_HEADER.lower() for k, _ in headers):
        return
    headers.append((TOKEN_HEADER, svc.execd_token(svc.get(sandbox_id))))


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@router.api_route("/sandboxes/{sandbox_id}/proxy/{port}", methods=_METHODS)
@router.api_route("/sandboxes/{sandbox_id}/proxy/{port}/{path:path}", methods=_METHODS)
async def proxy_http(
    request: Request, sandbox_id: str, port: int, path: str = ""
) -> StreamingResponse:
    client, base = await _target(request.app, sandbox_id, port)
    await request.app.state.service.renew_on_access(sandbox_id)
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
    _add_execd_token(request.app.state.service, sandbox_id, port, headers)
    propagate_into(headers)
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    upstream_req = client.build_request(
        request.method,
        f"{base}/{path}",
        params=request.url.query or None,
        headers=headers,
        content=request.stream() if has_body else None,
    )
    try:
        upstream = await client.send(upstream_req, stream=True)
    except httpx.HTTPError as exc:
        raise UpstreamUnreachable(
            f"port {port} of sandbox {sandbox_id} did not answer: {type(exc).__name__}: {exc}"
        ) from exc
    resp_headers = {
        k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP | {"server"}
    }
    location = upstream.headers.get("location")
    if location is not None:
        resp_headers["location"] = rebase_location(location, request.url.path, port)
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers=resp_headers,
        background=BackgroundTask(upstream.aclose),
    )


@router.websocket("/sandboxes/{sandbox_id}/proxy/{port}")
@router.websocket("/sandboxes/{sandbox_id}/proxy/{port}/{path:path}")
async def proxy_websocket(websocket: WebSocket, sandbox_id: str, port: int, path: str = "") -> None:
    svc: SandboxService = websocket.app.state.service
    try:
        _check_reachable(svc, sandbox_id)
    except SandlotError as exc:
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await svc.renew_on_access(sandbox_id)
    query = f"?{websocket.url.query}" if websocket.url.query else ""
    headers = [(k, v) for k, v in websocket.headers.items() if k.lower() not in _WS_SKIP]
    _add_execd_token(svc, sandbox_id, port, headers)
    subprotocols = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p
    ]
    try:
        sock = await svc.connect(sandbox_id, port)
        upstream = await ws_connect(
            f"ws://sandbox:{port}/{path}{query}",
            sock=sock,
            additional_headers=headers,
            subprotocols=subprotocols or None,  # type: ignore[arg-type]
            max_size=_WS_MAX_MESSAGE,
        )
    except Exception as exc:
        log.debug("websocket upstream for %s:%s failed: %s", sandbox_id, port, exc)
        await websocket.close(code=1011, reason="sandbox port did not accept the websocket")
        return
    await websocket.accept(subprotocol=upstream.subprotocol)

    async def client_to_upstream() -> None:
        with contextlib.suppress(WebSocketDisconnect, ConnectionClosed):
            while True:
                msg = await websocket.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                if msg.get("bytes") is not None:
                    await upstream.send(msg["bytes"])
                elif msg.get("text") is not None:
                    await upstream.send(msg["text"])

    async def upstream_to_client() -> None:
        with contextlib.suppress(WebSocketDisconnect, ConnectionClosed, RuntimeError):
            async for data in upstream:
                if isinstance(data, bytes):
                    await websocket.send_bytes(data)
                else:
                    await websocket.send_text(data)

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        with contextlib.suppress(Exception):
            await websocket.close()
