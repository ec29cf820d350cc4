"""In-process stand-ins for the runtime and image store, for the server's unit tests.

The fake "execd" is a real HTTP server (uvicorn on a loopback port of the host standing in
for execd's port in the sandbox), reached through the fake's ``connect`` like a real
runtime's, so readiness probing, direct endpoints and the server proxy (including SSE) are
exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from sandlot.config import Config
from sandlot.errors import ImageNotFound, NotFound, RuntimeFailure
from sandlot.images.model import Image, RegistryAuth
from sandlot.runtime.base import (
    ContainerInfo,
    ContainerState,
    CreateResult,
    ImageRef,
    Progress,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
)
from sandlot.runtime.execd_client import DEFAULT_PORT


def fake_execd_app(token: str | None) -> Starlette:
    def authorized(request: Request | WebSocket) -> bool:
        return token is None or request.headers.get("x-execd-access-token") == token

    async def ping(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"code": "UNAUTHORIZED", "message": "bad token"}, 401)
        return PlainTextResponse("pong")

    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "body": body.decode(),
                "headers": {k.lower(): v for k, v in request.headers.items()},
            }
        )

    async def events(request: Request) -> Response:
        async def gen():  # type: ignore[no-untyped-def]
            for i in range(3):
                yield f"data: event {i}\n\n".encode()
                await asyncio.sleep(0.05)

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        with contextlib.suppress(Exception):
            while True:
                text = await websocket.receive_text()
                await websocket.send_text(f"echo:{text}")

    return Starlette(
        routes=[
            Route("/ping", ping),
            Route("/echo", echo, methods=["GET", "POST", "PUT"]),
            Route("/events", events),
            WebSocketRoute("/ws", ws),
        ]
    )


class FakeContainer:
    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self.state = ContainerState.RUNNING
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.execd_port: int = self.sock.getsockname()[1]

    async def start(self) -> None:
        config = uvicorn.Config(
            fake_execd_app(self.spec.execd_token),
            log_level="warning",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 5)
        self.sock.close()


async def _connect_loopback(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


class FakeRuntime(Runtime):
    """A Runtime whose sandboxes are in-process HTTP servers."""

    name = "fake"

    def __init__(self, root: Path, images: FakeImages | None = None,
                 execd_port: int = DEFAULT_PORT):
        self.root = root
        self.images = images if images is not None else FakeImages(set())
        self.execd_port = execd_port
        self.capabilities = RuntimeCapabilities(isolation="fake")
        self.containers: dict[str, FakeContainer] = {}
        self.created: list[SandboxSpec] = []
        self.fail_create: str | None = None
        self.fail_deletes = 0  # how many of the next deletes fail
        self.tcp_services: dict[int, int] = {}  # sandbox port -> host port of a test server
        self.prewarmed: list[str] = []  # names of images the server asked to keep warm
        # Answers inspect gives first, one per call, before the container's own state.
        self.inspect_script: dict[str, list[ContainerState | Exception]] = {}

    @classmethod
    async def open(cls, cfg: Config) -> FakeRuntime:
        return cls(cfg.data_dir / "fake-runtime", execd_port=cfg.execd.port)

    async def prewarm(self, image: ImageRef) -> None:
        if self.images.get(image.reference) is not None:
            self.prewarmed.append(image.reference)

    async def create(self, spec: SandboxSpec, progress: Progress | None = None) -> CreateResult:
        if self.images.get(spec.image.reference) is None:
            if progress is not None:
                await progress("Pulling", f"pulling image {spec.image.reference}")
            await self.images.pull(spec.image.reference, spec.image.auth)
        if self.fail_create:
            raise RuntimeFailure(self.fail_create)
        self.created.append(spec)
        c = FakeContainer(spec)
        self.containers[spec.sandbox_id] = c
        await c.start()
        return CreateResult(execd_ready=False)  # the service waits for the fake's /ping

    async def delete(self, sandbox_id: str) -> None:
        if self.fail_deletes > 0:
            self.fail_deletes -= 1
            raise RuntimeFailure("runc delete failed (injected)")
        c = self.containers.pop(sandbox_id, None)
        if c is not None:
            await c.stop()
        shutil.rmtree(self.root / sandbox_id, ignore_errors=True)

    async def pause(self, sandbox_id: str) -> None:
        self._get(sandbox_id).state = ContainerState.PAUSED

    async def resume(self, sandbox_id: str) -> None:
        self._get(sandbox_id).state = ContainerState.RUNNING

    def _get(self, sandbox_id: str) -> FakeContainer:
        c = self.containers.get(sandbox_id)
        if c is None:
            raise RuntimeFailure(f"no container {sandbox_id}")
        return c

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        script = self.inspect_script.get(sandbox_id)
        if script:
            answer = script.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return ContainerInfo(sandbox_id, answer)
        c = self.containers.get(sandbox_id)
        if c is None:
            return ContainerInfo(sandbox_id, ContainerState.MISSING)
        return ContainerInfo(sandbox_id, c.state, pid=1)

    async def list_ids(self) -> set[str]:
        return set(self.containers)

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        c = self.containers.get(sandbox_id)
        if c is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if port == self.execd_port:
            return await _connect_loopback(c.execd_port)
        if port not in self.tcp_services:
            raise ConnectionRefusedError(f"nothing listens on port {port}")
        return await _connect_loopback(self.tcp_services[port])

    async def close(self) -> None:
        pass

    async def stop_all(self) -> None:
        for sid in list(self.containers):
            await self.delete(sid)


class FakeImages:
    def __init__(self, local: set[str], pullable: set[str] | None = None):
        self.local = set(local)
        self.pullable = set(pullable or ())
        self.pulls: list[tuple[str, RegistryAuth | None]] = []
        self.pull_gate: asyncio.Event | None = None

    def _image(self, name: str) -> Image:
        return Image(name=name, id="sha256:" + "0" * 64, lower_dirs=[])

    def get(self, name: str) -> Image | None:
        return self._image(name) if name in self.local else None

    async def pull(
        self, name: str, auth: RegistryAuth | None = None, progress: Any = None
    ) -> Image:
        self.pulls.append((name, auth))
        if self.pull_gate is not None:
            await self.pull_gate.wait()
        if name not in self.pullable:
            raise ImageNotFound(f"image {name} not found in its registry")
        self.local.add(name)
        return self._image(name)


async def connect_loopback(port: int) -> socket.socket:
    """A connected non-blocking socket to ``127.0.0.1:port`` (what ``Runtime.connect`` gives)."""
    return await _connect_loopback(port)
