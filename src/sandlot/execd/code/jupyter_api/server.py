"""The Jupyter Server REST + WebSocket routes, served on 127.0.0.1:$JUPYTER_PORT inside the sandbox.

Why execd serves it rather than Jupyter Server itself: the kernels are the code service's (one
warm pool, one set of kernelspecs, Java and Go included, the same OOM handling), no second
Python stack has to be in the image, and a Jupyter Server process would cost ~60-80 MB and about
a second of CPU at every sandbox start (see docs/code-interpreter.md for the measurement).

Routes (as Jupyter Server's): ``GET /api``, ``GET /api/status``, ``GET /api/kernelspecs``,
``GET /api/kernelspecs/{name}``, ``GET|POST /api/kernels``, ``GET|DELETE /api/kernels/{id}``,
``POST /api/kernels/{id}/interrupt``, ``POST /api/kernels/{id}/restart``, and the WebSocket
``/api/kernels/{id}/channels``. Every request carries the token as ``Authorization: token ...``
(or ``Bearer``) or ``?token=``; without it HTTP answers 403 and a WebSocket is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from sandlot.errors import InvalidRequest, SandlotError
from sandlot.execd.http import optional_object
from sandlot.jupyter_token import jupyter_token

from . import messages
from .kernels import Client
from .registry import KernelRegistry
from .settings import JupyterApiSettings

if TYPE_CHECKING:
    from ..service import CodeService

log = logging.getLogger(__name__)

API_VERSION = "2.14.0"  # the Jupyter Server REST API version these routes follow


def _token_of(conn: HTTPConnection) -> str:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    return conn.query_params.get("token", "")


class JupyterApi:
    def __init__(self, service: CodeService, settings: JupyterApiSettings,
                 tokens: tuple[str, ...]):
        self.registry = KernelRegistry(service, settings)
        self._tokens = tuple(t.encode() for t in tokens if t)
        self.app = Starlette(routes=self._routes())

    def allowed(self, conn: HTTPConnection) -> bool:
        if not self._tokens:
            return True
        given = _token_of(conn).encode()
        return any(hmac.compare_digest(given, t) for t in self._tokens)

    def _routes(self) -> list[Any]:
        def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Any:
            async def endpoint(request: Request) -> Response:
                if not self.allowed(request):
                    return _error(403, "FORBIDDEN", "missing or invalid Jupyter token (send "
                                  "'Authorization: token <token>' or ?token=)")
                try:
                    return await handler(request)
                except SandlotError as exc:
                    return _error(exc.status, exc.code, exc.message)
            return endpoint

        return [
            Route("/api", guarded(self.version), methods=["GET"]),
            Route("/api/status", guarded(self.status), methods=["GET"]),
            Route("/api/kernelspecs", guarded(self.kernelspecs), methods=["GET"]),
            Route("/api/kernelspecs/{name}", guarded(self.kernelspec), methods=["GET"]),
            Route("/api/kernels", guarded(self.list_kernels), methods=["GET"]),
            Route("/api/kernels", guarded(self.start_kernel), methods=["POST"]),
            Route("/api/kernels/{kernel_id}", guarded(self.get_kernel), methods=["GET"]),
            Route("/api/kernels/{kernel_id}", guarded(self.delete_kernel), methods=["DELETE"]),
            Route("/api/kernels/{kernel_id}/interrupt", guarded(self.interrupt),
                  methods=["POST"]),
            Route("/api/kernels/{kernel_id}/restart", guarded(self.restart), methods=["POST"]),
            WebSocketRoute("/api/kernels/{kernel_id}/channels", self.channels),
        ]

    # ---- REST ------------------------------------------------------------------------------
    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": API_VERSION})

    async def status(self, request: Request) -> Response:
        kernels = self.registry.all()
        last = max((k.last_activity for k in kernels), default=None)
        return JSONResponse({
            "started": None, "kernels": len(kernels),
            "connections": sum(len(k.clients) for k in kernels),
            "last_activity": last.isoformat().replace("+00:00", "Z") if last else None,
        })

    async def kernelspecs(self, request: Request) -> Response:
        return JSONResponse(self.registry.kernelspecs())

    async def kernelspec(self, request: Request) -> Response:
        return JSONResponse(self.registry.kernelspec(request.path_params["name"]))

    async def list_kernels(self, request: Request) -> Response:
        return JSONResponse([k.model() for k in self.registry.all()])

    async def start_kernel(self, request: Request) -> Response:
        body = await optional_object(request)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("'name' must be a string", code="INVALID_REQUEST_BODY")
        env = body.get("env") or {}
        if not isinstance(env, dict):
            raise InvalidRequest("'env' must be an object", code="INVALID_REQUEST_BODY")
        # As Jupyter Kernel Gateway does: clients pass KERNEL_* variables to the kernel;
        # anything else in 'env' (gateway clients send their own settings too) is not applied.
        extra = {str(k): str(v) for k, v in env.items() if str(k).startswith("KERNEL_")}
        ignored = sorted(str(k) for k in env if not str(k).startswith("KERNEL_"))
        if ignored:
            log.info("kernel start: env variables not applied (only KERNEL_*): %s", ignored)
        path = body.get("path")
        cwd = path if isinstance(path, str) and path.startswith("/") else None
        kernel = await self.registry.start(name, extra, cwd)
        return JSONResponse(kernel.model(), status_code=201,
                            headers={"Location": f"/api/kernels/{kernel.id}"})

    async def get_kernel(self, request: Request) -> Response:
        return JSONResponse(self.registry.get(request.path_params["kernel_id"]).model())

    async def delete_kernel(self, request: Request) -> Response:
        await self.registry.delete(request.path_params["kernel_id"])
        return Response(status_code=204)

    async def interrupt(self, request: Request) -> Response:
        await self.registry.get(request.path_params["kernel_id"]).interrupt()
        return Response(status_code=204)

    async def restart(self, request: Request) -> Response:
        kernel = self.registry.get(request.path_params["kernel_id"])
        await kernel.restart()
        return JSONResponse(kernel.model())

    # ---- channels --------------------------------------------------------------------------
    async def channels(self, ws: WebSocket) -> None:
        if not self.allowed(ws):
            await ws.close(code=1008, reason="missing or invalid Jupyter token")
            return
        kernel = self.registry.kernels.get(ws.path_params["kernel_id"])
        if kernel is None:
            await ws.close(code=1008, reason="kernel not found")
            return
        await ws.accept()
        client = Client(ws, ws.query_params.get("session_id", ""))
        await kernel.attach(client)
        try:
            while True:
                frame = await ws.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                text = frame.get("text")
                if text is None:
                    log.info("kernel %s: binary WebSocket frame ignored (JSON framing only)",
                             kernel.id)
                    continue
                try:
                    msg = messages.decode(text)
                except ValueError as exc:
                    log.warning("kernel %s: bad message from client: %s", kernel.id, exc)
                    continue
                await kernel.from_client(client, msg)
        except WebSocketDisconnect:
            pass
        finally:
            await kernel.detach(client)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "reason": None}, status_code=status)


class JupyterApiServer:
    """The API on a TCP port; ``close()``/``wait_closed()`` like the asyncio server it replaces."""

    def __init__(self, api: JupyterApi, server: Any, task: asyncio.Task[None]):
        self.api = api
        self._server = server
        self._task = task

    def close(self) -> None:
        self._server.request_exit()

    async def wait_closed(self) -> None:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        if not self._task.done():
            self._task.cancel()
        await self.api.registry.close()


async def serve_jupyter_api(
    service: CodeService, port: int, execd_token: str | None,
    settings: JupyterApiSettings | None = None,
) -> JupyterApiServer | None:
    """Start serving on 127.0.0.1:``port``; None when the port cannot be had.

    Served by execd's own HTTP layer (``sandlot.execd.httpserver``), as execd's API is: no
    housekeeping tick while idle, no signal capture (execd's handlers stay in charge)."""
    from sandlot.execd.httpserver import HttpServer

    settings = settings or JupyterApiSettings.from_env()
    tokens = (*([jupyter_token(execd_token)] if execd_token else []), *settings.extra_tokens)
    if not tokens:
        log.warning("Jupyter API on port %d has no token: open to anyone who reaches it", port)
    api = JupyterApi(service, settings, tokens)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        log.warning("Jupyter API not served on 127.0.0.1:%d: %s", port, exc)
        return None
    server = HttpServer(api.app, keep_alive_timeout=5.0, ws_max_size=64 << 20)
    task = asyncio.create_task(server.serve([sock]))
    started = asyncio.ensure_future(server.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if not server.started.is_set():
        started.cancel()
        with contextlib.suppress(BaseException):
            task.result()
        log.warning("Jupyter API not served on 127.0.0.1:%d", port)
        return None
    api.registry.start_culling()
    return JupyterApiServer(api, server, task)
