"""Kernels started through the Jupyter API, and the WebSocket clients attached to them.

Two kinds behind one interface (:class:`ApiKernel`): a Jupyter kernel (:mod:`.zmq_kernel`),
whose ZMQ channels are bridged message for message to each client, as Jupyter Server does; and
sandlot's native contexts (:mod:`.native_kernel`: Java, Go, JavaScript, TypeScript), for which
execd speaks the kernel side of the messaging protocol itself.

A kernel that dies while a client waits for an execution (an out-of-memory kill, a crash) is
reported to that client as an ``error`` and an ``execute_reply`` with status ``error`` (the
message says it ran out of memory when the cgroup says so), then restarted in place, as Jupyter
Server's restarter does: the next execution runs in a fresh kernel.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.websockets import WebSocket

from ..kernels.base import describe_exit
from ..oom import OOM_MESSAGE
from . import messages

log = logging.getLogger(__name__)



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
