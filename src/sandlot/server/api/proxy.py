"""Server proxy: ``/sandboxes/{id}/proxy/{port}/...`` forwards HTTP (streamed, so SSE works)
and WebSockets to a port inside the sandbox.

execd (``cfg.execd.port``) is reached over its unix socket; any other port through the
sandbox's direct-endpoint listener. The caller's API key is stripped: it must never travel
into the untrusted sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.client import unix_connect as ws_unix_connect
from websockets.exceptions import ConnectionClosed

from sandlot.errors import Conflict, SandlotError
from sandlot.server.execd_probe import unix_socket_client
from sandlot.server.models import SandboxState
from sandlot.server.service import SandboxService

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
_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)


class UpstreamUnreachable(SandlotError):
    status = 502
    code = "SANDBOX_UNREACHABLE"


class ProxyClients:
    """One pooled HTTP client per sandbox (unix socket to execd) plus one for TCP ports."""

    def __init__(self, svc: SandboxService):
        self.svc = svc
        self._execd: dict[str, httpx.AsyncClient] = {}
        self._tcp = httpx.AsyncClient(timeout=_TIMEOUT)
        svc.terminate_hooks.append(self.forget)

    def execd(self, sandbox_id: str) -> httpx.AsyncClient:
        client = self._execd.get(sandbox_id)
        if client is None:
            client = unix_socket_client(self.svc.runtime.execd_socket(sandbox_id), _TIMEOUT)
            self._execd[sandbox_id] = client
        return client

    @property
    def tcp(self) -> httpx.AsyncClient:
        return self._tcp

    async def forget(self, sandbox_id: str) -> None:
        client = self._execd.pop(sandbox_id, None)
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        for client in self._execd.values():
            await client.aclose()
        self._execd.clear()
        await self._tcp.aclose()


def _check_reachable(svc: SandboxService, sandbox_id: str) -> None:
    rec = svc.get(sandbox_id)
    if rec.state != SandboxState.RUNNING:
        raise Conflict(
            f"sandbox {sandbox_id} is {rec.state.value}; the proxy reaches Running sandboxes only",
            code="SANDBOX_STATE_CONFLICT",
        )


async def _target(request_app: Any, sandbox_id: str, port: int) -> tuple[httpx.AsyncClient, str]:
    svc: SandboxService = request_app.state.service
    clients: ProxyClients = request_app.state.proxy_clients
    _check_reachable(svc, sandbox_id)
    if port == svc.cfg.execd.port:
        return clients.execd(sandbox_id), "http://execd"
    host_port = await svc.open_endpoint(sandbox_id, port)
    return clients.tcp, f"http://127.0.0.1:{host_port}"


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@router.api_route("/sandboxes/{sandbox_id}/proxy/{port}", methods=_METHODS)
@router.api_route("/sandboxes/{sandbox_id}/proxy/{port}/{path:path}", methods=_METHODS)
async def proxy_http(
    request: Request, sandbox_id: str, port: int, path: str = ""
) -> StreamingResponse:
    client, base = await _target(request.app, sandbox_id, port)
    await request.app.state.service.renew_on_access(sandbox_id)
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
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
    subprotocols = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p
    ]
    try:
        if port == svc.cfg.execd.port:
            sock = str(svc.runtime.execd_socket(sandbox_id))
            upstream_cm = ws_unix_connect(
                sock,
                f"ws://execd/{path}{query}",
                additional_headers=headers,
                subprotocols=subprotocols or None,  # type: ignore[arg-type]
            )
        else:
            host_port = await svc.open_endpoint(sandbox_id, port)
            upstream_cm = ws_connect(
                f"ws://127.0.0.1:{host_port}/{path}{query}",
                additional_headers=headers,
                subprotocols=subprotocols or None,  # type: ignore[arg-type]
            )
        upstream = await upstream_cm
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
