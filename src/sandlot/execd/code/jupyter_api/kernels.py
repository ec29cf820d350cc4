"""Kernels started through the Jupyter API, and the WebSocket clients attached to them.

Two kinds behind one interface: a Jupyter kernel (ipykernel, bash_kernel, any kernelspec), whose
ZMQ channels are bridged message for message to each client, as Jupyter Server does; and
sandlot's native contexts (Java, Go, JavaScript, TypeScript), for which this module speaks the
kernel side of the messaging protocol itself (kernel_info, execute, interrupt, ...).

A kernel that dies while a client waits for an execution (an out-of-memory kill, a crash) is
reported to that client as an ``error`` and an ``execute_reply`` with status ``error`` (the
message says it ran out of memory when the cgroup says so), then restarted in place, as Jupyter
Server's restarter does: the next execution runs in a fresh kernel.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from starlette.websockets import WebSocket

from sandlot.execd.oomscore import prefer_for_oom

from ..kernels.base import Kernel, KernelDied, Output, describe_exit
from ..kernels.exitwatch import returncode, watch_exit
from ..oom import OOM_MESSAGE, OomWatch
from . import messages

log = logging.getLogger(__name__)

# How often a kernel without an exit watch (execd not PID 1, e.g. tests) is checked for life.
_POLL = 0.5
CHANNELS = ("shell", "control", "stdin", "iopub")


def now() -> datetime:
    return datetime.now(UTC)


class Client:
    """One WebSocket connection to a kernel's channels."""

    def __init__(self, ws: WebSocket, session_id: str):
        self.ws = ws
        self.session_id = session_id or uuid.uuid4().hex
        self.identity = f"{self.session_id}-{uuid.uuid4().hex[:8]}".encode()
        self.pending: dict[str, dict[str, Any]] = {}  # execute_request msg_id -> request
        self._lock = asyncio.Lock()
        self.closed = False

    async def send(self, msg: dict[str, Any]) -> None:
        if self.closed:
            return
        if msg.get("msg_type") == "execute_reply":
            self.pending.pop(msg.get("parent_header", {}).get("msg_id", ""), None)
        async with self._lock:
            try:
                await self.ws.send_text(messages.encode(msg))
            except Exception:  # the client went away; its reader ends the connection
                self.closed = True


class ApiKernel(abc.ABC):
    """What the REST routes and the channels WebSocket need from a kernel."""

    def __init__(self, kernel_id: str, name: str, language: str):
        self.id = kernel_id
        self.name = name
        self.language = language
        self.last_activity = now()
        self.execution_state = "starting"
        self.clients: set[Client] = set()
        self.execution_count = 0
        self.closing = False

    def model(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "last_activity": self.last_activity.isoformat().replace("+00:00", "Z"),
            "execution_state": self.execution_state,
            "connections": len(self.clients),
        }

    def touch(self) -> None:
        self.last_activity = now()

    async def broadcast(self, msg: dict[str, Any]) -> None:
        await asyncio.gather(*(c.send(msg) for c in list(self.clients)))

    async def report_death(self, ename: str, evalue: str) -> None:
        """Tell every client waiting for an execution that the kernel died, then restart."""
        for client in list(self.clients):
            for request in list(client.pending.values()):
                for msg in messages.died_messages(request, ename, evalue, self.execution_count):
                    await client.send(msg)
            client.pending.clear()
        self.execution_state = "restarting"
        await self.broadcast(messages.status("restarting", None))

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def attach(self, client: Client) -> None: ...

    async def detach(self, client: Client) -> None:
        client.closed = True
        self.clients.discard(client)

    @abc.abstractmethod
    async def from_client(self, client: Client, msg: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def interrupt(self) -> None: ...

    @abc.abstractmethod
    async def restart(self) -> None: ...

    @abc.abstractmethod
    async def shutdown(self) -> None: ...


def died_text(language: str, oom: bool, rc: int | None) -> tuple[str, str]:
    if oom:
        return "OutOfMemoryError", OOM_MESSAGE
    return "KernelDied", (
        f"the {language} kernel exited ({describe_exit(rc)}); it was restarted, so earlier "
        "state is gone"
    )


class ZmqApiKernel(ApiKernel):
    """A Jupyter kernel process; each client gets its own ZMQ sockets, as in Jupyter Server."""

    def __init__(self, kernel_id: str, name: str, language: str, km: AsyncKernelManager,
                 *, cwd: str | None, env: dict[str, str], started: bool = False):
        super().__init__(kernel_id, name, language)
        self.km = km
        self._cwd = cwd
        self._env = env
        self._started = started
        self._sockets: dict[Client, dict[str, Any]] = {}
        self._pumps: dict[Client, list[asyncio.Task[None]]] = {}
        self._monitor: asyncio.Task[None] | None = None
        self._status_socket: Any = None
        # Cleared while the kernel restarts: clients' messages wait instead of reaching a
        # kernel whose output nobody is subscribed to yet.
        self._ready = asyncio.Event()
        self._ready.set()

    @property
    def pid(self) -> int | None:
        proc = getattr(self.km.provisioner, "process", None)
        return getattr(proc, "pid", None)

    async def start(self) -> None:
        if not self._started:
            await self.km.start_kernel(cwd=self._cwd, env=self._env)
            await self._wait_ready()
        self._after_start()

    async def _wait_ready(self) -> None:
        """Answering kernel_info before the model says idle (a client's first cell then runs)."""
        kc = self.km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=None)
        finally:
            kc.stop_channels()

    def _after_start(self) -> None:
        self.execution_state = "idle"
        prefer_for_oom(self.pid)
        self._status_socket = self.km.connect_iopub()
        self._monitor = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        """Follow the kernel's status (for the REST model and culling) and notice its death."""
        oom = OomWatch(self.pid)
        exit_future = watch_exit(self.pid)
        status_task = asyncio.create_task(self._follow_status())
        try:
            while not self.closing:
                if exit_future is not None:
                    await asyncio.wait({exit_future}, timeout=_POLL)
                    alive = not exit_future.done()
                else:
                    await asyncio.sleep(_POLL)
                    alive = bool(await self.km.is_alive())
                if alive or self.closing:
                    continue
                proc = getattr(self.km.provisioner, "process", None)
                rc = returncode(exit_future, proc.poll() if proc is not None else None)
                ename, evalue = died_text(self.language, oom.was_oom(rc == -9), rc)
                log.warning("jupyter api kernel %s died: %s", self.id, ename)
                await self.report_death(ename, evalue)
                await self._restart_processes()
                return  # the restarted kernel has its own watch
        finally:
            status_task.cancel()
            with contextlib.suppress(BaseException):
                await status_task

    async def _follow_status(self) -> None:
        sock = self._status_socket
        # Each reader its own session copy: a session refuses a signature it has seen before,
        # and every iopub reader sees the same messages.
        session = self.km.session.clone()
        while True:
            parts = await sock.recv_multipart()
            try:
                _, msg_list = session.feed_identities(parts)
                msg = session.deserialize(msg_list)
            except Exception:  # noqa: BLE001 - a malformed message changes nothing here
                continue
            self.touch()
            if msg["msg_type"] == "status":
                self.execution_state = msg["content"].get("execution_state", "idle")
            elif msg["msg_type"] == "execute_input":
                self.execution_count = msg["content"].get("execution_count") or 0

    async def _restart_processes(self) -> None:
        self._ready.clear()
        try:
            self._close_status_socket()
            self.execution_state = "starting"
            await self.km.restart_kernel(now=True)
            await self._wait_ready()
            self._after_start()
            for client in list(self.clients):  # fresh sockets, subscribed before any output
                self._close_sockets(client)
                await self._connect(client)
        finally:
            self._ready.set()

    def _close_status_socket(self) -> None:
        if self._status_socket is not None:
            self._status_socket.close(linger=0)
            self._status_socket = None

    async def attach(self, client: Client) -> None:
        await self._ready.wait()
        await self._connect(client)
        self.clients.add(client)

    async def _connect(self, client: Client) -> None:
        sockets = {
            "shell": self.km.connect_shell(identity=client.identity),
            "control": self.km.connect_control(identity=client.identity),
            "stdin": self.km.connect_stdin(identity=client.identity),
            "iopub": self.km.connect_iopub(),
        }
        await self._nudge(sockets)
        self._sockets[client] = sockets
        self._pumps[client] = [
            asyncio.create_task(self._pump(client, channel, sock))
            for channel, sock in sockets.items()
        ]

    async def _nudge(self, sockets: dict[str, Any]) -> None:
        """Ask kernel_info until the new iopub socket receives something: only then is it
        subscribed, and a client's first cell cannot lose its output (Jupyter Server does the
        same). The nudges' shell replies are consumed here; their iopub statuses reach the
        client, which ignores statuses of requests it did not send."""
        session = self.km.session.clone()
        shell, iopub = sockets["shell"], sockets["iopub"]
        sent = 0
        for _ in range(50):
            session.send(shell, "kernel_info_request")
            sent += 1
            if await iopub.poll(200):
                break
        deadline = asyncio.get_running_loop().time() + 5
        while sent and asyncio.get_running_loop().time() < deadline:
            if await shell.poll(200):
                await shell.recv_multipart()
                sent -= 1

    async def _pump(self, client: Client, channel: str, sock: Any) -> None:
        session = self.km.session.clone()
        while not client.closed:
            parts = await sock.recv_multipart()
            try:
                _, msg_list = session.feed_identities(parts)
                msg = session.deserialize(msg_list)
            except Exception as exc:  # noqa: BLE001 - a bad signature or frame
                log.warning("dropping a malformed %s message from kernel %s: %s",
                            channel, self.id, exc)
                continue
            msg["channel"] = channel
            msg.pop("buffers", None)
            await client.send(msg)

    async def detach(self, client: Client) -> None:
        await super().detach(client)
        self._close_sockets(client)

    def _close_sockets(self, client: Client) -> None:
        for task in self._pumps.pop(client, []):
            task.cancel()
        for sock in self._sockets.pop(client, {}).values():
            sock.close(linger=0)

    async def from_client(self, client: Client, msg: dict[str, Any]) -> None:
        await self._ready.wait()
        channel = msg.pop("channel", None) or "shell"
        sock = self._sockets.get(client, {}).get(channel)
        if sock is None or channel == "iopub":
            log.warning("kernel %s: message for unknown channel %r dropped", self.id, channel)
            return
        self.touch()
        if msg["header"].get("msg_type") == "execute_request":
            client.pending[msg["header"].get("msg_id", "")] = msg
        self.km.session.send(sock, msg)

    async def interrupt(self) -> None:
        await self.km.interrupt_kernel()

    async def restart(self) -> None:
        self.closing = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(BaseException):
                await self._monitor
        self.closing = False
        await self.broadcast(messages.status("restarting", None))
        await self._restart_processes()

    async def shutdown(self) -> None:
        self.closing = True
        for client in list(self.clients):
            await self.detach(client)
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(BaseException):
                await self._monitor
        self._close_status_socket()
        try:
            if self.km.has_kernel:
                await self.km.shutdown_kernel(now=True)
        except Exception:  # a dead kernel may refuse a clean shutdown
            await self.km.cleanup_resources(restart=False)


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
