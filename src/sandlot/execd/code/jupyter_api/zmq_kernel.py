"""A Jupyter kernel behind the Jupyter API: its ZMQ channels bridged to each WebSocket client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from sandlot.execd.oomscore import prefer_for_oom

from .. import identity, kernelstdio
from ..kernels import ready
from ..kernels.exitwatch import returncode, watch_exit
from ..oom import OomWatch
from . import messages
from .kernels import ApiKernel, Client, died_text

log = logging.getLogger(__name__)

# How often a kernel without an exit watch (execd not PID 1, e.g. tests) is checked for life.
_POLL = 0.5


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
            identity.prepare_connection_file(self.km)
            await self.km.start_kernel(cwd=self._cwd, env=self._env,
                                       **identity.popen_kwargs(),
                                       **kernelstdio.popen_kwargs())
            prefer_for_oom(self.pid)  # from its first moment (kernels/jupyter.py says why)
            await self._wait_ready()
        self._after_start()

    async def _wait_ready(self) -> None:
        """Answering kernel_info before the model says idle (a client's first cell then runs)."""
        kc = self.km.client()
        kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            await ready.wait_ready(kc, math.inf, self.km.is_alive)
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
            prefer_for_oom(self.pid)
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
