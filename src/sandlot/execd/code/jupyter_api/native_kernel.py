"""A native context (Java, Go, JavaScript, TypeScript) behind the Jupyter messaging protocol."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..kernels.base import Kernel, KernelDied, Output
from ..oom import OomWatch
from . import messages
from .kernels import ApiKernel, Client, died_text

log = logging.getLogger(__name__)


LANGUAGE_INFO = {
    "java": {"name": "java", "mimetype": "text/x-java-source", "file_extension": ".jshell",
             "codemirror_mode": "text/x-java", "pygments_lexer": "java"},
    "go": {"name": "go", "mimetype": "text/x-go", "file_extension": ".go",
           "codemirror_mode": "go", "pygments_lexer": "go"},
    "javascript": {"name": "javascript", "mimetype": "application/javascript",
                   "file_extension": ".js", "codemirror_mode": "javascript"},
    "typescript": {"name": "typescript", "mimetype": "text/typescript",
                   "file_extension": ".ts", "codemirror_mode": "typescript"},
}


class NativeApiKernel(ApiKernel):
    """A native context (one :class:`Kernel`) behind the kernel side of the messaging protocol."""

    def __init__(self, kernel_id: str, name: str, language: str, factory: Any):
        super().__init__(kernel_id, name, language)
        self._factory = factory  # () -> Kernel (not started)
        self.kernel: Kernel | None = None
        self._run_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.kernel = await self._factory()
        self.execution_state = "idle"

    async def attach(self, client: Client) -> None:
        self.clients.add(client)

    async def from_client(self, client: Client, msg: dict[str, Any]) -> None:
        self.touch()
        channel = msg.get("channel") or "shell"
        kind = msg["header"].get("msg_type", "")
        parent = msg["header"]
        if kind == "execute_request":
            client.pending[parent.get("msg_id", "")] = msg
            task = asyncio.create_task(self._execute(client, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if kind == "interrupt_request":
            await self.interrupt()
            await client.send(messages.make("interrupt_reply", {"status": "ok"}, parent, channel))
            return
        reply = self._simple_reply(kind, msg.get("content", {}))
        if reply is None:
            log.info("native kernel %s: %s not supported, ignored", self.language, kind)
            return
        await client.send(messages.status("busy", parent))
        await client.send(messages.make(kind.replace("_request", "_reply"), reply, parent,
                                        channel))
        await client.send(messages.status(self.execution_state, parent))

    def _simple_reply(self, kind: str, content: dict[str, Any]) -> dict[str, Any] | None:
        if kind == "kernel_info_request":
            return {
                "status": "ok", "protocol_version": messages.PROTOCOL_VERSION,
                "implementation": f"sandlot-{self.language}", "implementation_version": "1",
                "language_info": LANGUAGE_INFO.get(self.language, {"name": self.language}),
                "banner": f"sandlot {self.language} context", "help_links": [],
            }
        if kind == "complete_request":
            cursor = int(content.get("cursor_pos", 0) or 0)
            return {"status": "ok", "matches": [], "cursor_start": cursor,
                    "cursor_end": cursor, "metadata": {}}
        if kind == "inspect_request":
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        if kind == "is_complete_request":
            return {"status": "unknown"}
        if kind == "comm_info_request":
            return {"status": "ok", "comms": {}}
        if kind == "history_request":
            return {"status": "ok", "history": []}
        if kind == "shutdown_request":
            return {"status": "ok", "restart": bool(content.get("restart", False))}
        return None

    async def _execute(self, client: Client, request: dict[str, Any]) -> None:
        parent = request["header"]
        content = request.get("content", {})
        code = str(content.get("code", ""))
        silent = bool(content.get("silent", False))
        async with self._run_lock:
            self.execution_state = "busy"
            await self.broadcast(messages.status("busy", parent))
            if not silent:
                self.execution_count += 1
            count = self.execution_count
            await self.broadcast(messages.make(
                "execute_input", {"code": code, "execution_count": count}, parent, "iopub"))
            outputs: asyncio.Queue[Output | None] = asyncio.Queue()
            error: dict[str, Any] | None = None
            kernel = self.kernel
            assert kernel is not None
            oom = OomWatch(kernel.pid)

            async def forward() -> None:
                nonlocal error
                while (out := await outputs.get()) is not None:
                    if out.kind in ("stdout", "stderr"):
                        await self.broadcast(messages.make(
                            "stream", {"name": out.kind, "text": out.text}, parent, "iopub"))
                    elif out.kind == "result":
                        await self.broadcast(messages.make(
                            "execute_result",
                            {"execution_count": count, "data": out.data, "metadata": {}},
                            parent, "iopub"))
                    elif out.kind == "error":
                        error = {"ename": out.ename, "evalue": out.evalue,
                                 "traceback": out.traceback}
                        await self.broadcast(messages.make("error", error, parent, "iopub"))

            forwarder = asyncio.create_task(forward())
            died: KernelDied | None = None
            try:
                await kernel.execute(code, outputs.put_nowait)
            except KernelDied as exc:
                died = exc
            finally:
                outputs.put_nowait(None)
                await forwarder
            self.touch()
            if died is not None:
                ename, evalue = died_text(self.language, oom.was_oom(died.killed),
                                          died.returncode)
                await self.report_death(ename, evalue)
                await self._replace_kernel()
                self.execution_state = "idle"
                return
            reply: dict[str, Any] = {"status": "ok", "execution_count": count,
                                     "user_expressions": {}, "payload": []}
            if error is not None:
                reply = {"status": "error", "execution_count": count, **error}
            await client.send(messages.make("execute_reply", reply, parent, "shell"))
            self.execution_state = "idle"
            await self.broadcast(messages.status("idle", parent))

    async def _replace_kernel(self) -> None:
        old, self.kernel = self.kernel, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.shutdown()
        self.kernel = await self._factory()

    async def interrupt(self) -> None:
        if self.kernel is not None:
            await self.kernel.interrupt()

    async def restart(self) -> None:
        await self.interrupt()
        async with self._run_lock:
            await self._replace_kernel()
            self.execution_count = 0
        await self.broadcast(messages.status("restarting", None))
        await self.broadcast(messages.status("idle", None))

    async def shutdown(self) -> None:
        self.closing = True
        for client in list(self.clients):
            await self.detach(client)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.kernel is not None:
            await self.kernel.shutdown()
            self.kernel = None
