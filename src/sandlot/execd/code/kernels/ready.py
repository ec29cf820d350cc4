"""Waiting until a freshly started Jupyter kernel can take a cell, without idle waits.

``KernelClient.wait_for_ready`` asks ``kernel_info`` until a reply comes, then waits up to
0.2 s for an iopub message (its proof that iopub is subscribed; without one it starts
over), and at the end "flushes" iopub: it reads until 0.2 s pass without a message. That
last wait is spent on every start, after the kernel is ready: 0.2 s of a ~1 s start, paid
by each new context that waits for a kernel (a back-to-back one waits for the pool's).

Here both proofs are awaited together: ``kernel_info`` is asked again every ``NUDGE``
seconds until the shell has answered and iopub has delivered a message. Nothing is
flushed: the iopub statuses of these requests stay queued and the run's reader skips them
(their parent is not the run's request).

The requests go out on a shell connection of readiness's own (``connect_shell``), read on
the loop's own poll and closed once the kernel is ready, so the client's shell socket never
holds their replies. A kernel whose shell does not answer on that connection within
``REOPEN_AFTER`` seconds is asked on a new one: a ZeroMQ ROUTER that missed its wake-up
(the request sits in the socket, the kernel idles; about 1 in 1,000 starts under load in
sandlot's loop, ``tools/repro_first_cell_stall.py``) reads everything queued when a peer
connects, so the new connection gets it going again where the old code waited out the whole
start timeout (60 s) with the kernel idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .listener import SocketListener

NUDGE = 0.2  # seconds between kernel_info requests while not yet ready
REOPEN_AFTER = 3.0  # seconds without a shell reply before asking on a new connection

log = logging.getLogger(__name__)


class _ShellAsker:
    """kernel_info requests on a shell connection of its own; ``answered`` resolves on the
    first reply. ``reopen`` replaces the connection by a new one."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.asked = 0
        self.connections = 0
        self._listener: SocketListener | None = None
        self.answered: asyncio.Future[None] = self._open()

    def _open(self) -> asyncio.Future[None]:
        self._listener = SocketListener(self._client.connect_shell(), self._client.session)
        self.connections += 1
        self.opened = time.monotonic()
        return self._listener.first()

    def ask(self) -> None:
        """Send a request, then take what is queued: the send itself may have consumed the
        descriptor's wake-up for a reply that arrived meanwhile."""
        if self._listener is not None:
            self._client.session.send(self._listener.socket, "kernel_info_request")
            self.asked += 1
            self._listener.drain()

    def reopen(self) -> None:
        self.close()
        self.answered = self._open()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


async def wait_ready(client: Any, timeout: float, alive: Callable[[], Awaitable[bool]],
                     iopub: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Return once ``client``'s kernel has answered ``kernel_info`` on the shell and its
    iopub socket has received a message (``iopub()``'s result when given, else the
    client's iopub channel's). ``alive()`` is awaited between nudges; a dead kernel or
    ``timeout`` seconds raise ``RuntimeError`` (as ``wait_for_ready`` does)."""
    deadline = time.monotonic() + timeout
    first = iopub() if iopub is not None else client.iopub_channel.socket.recv_multipart()
    iopub_seen = asyncio.ensure_future(first)
    shell = _ShellAsker(client)
    try:
        while True:
            shell.ask()
            waiting = [f for f in (shell.answered, iopub_seen) if not f.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=NUDGE)
            if iopub_seen.done():
                iopub_seen.result()  # a socket error ends the wait
            if shell.answered.done() and iopub_seen.done():
                if shell.connections > 1:
                    log.warning("kernel answered kernel_info only on shell connection %d "
                                "(%d requests)", shell.connections, shell.asked)
                return
            if not await alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            now = time.monotonic()
            if now > deadline:
                missing = " and ".join(
                    what for what, future in (("no shell reply", shell.answered),
                                              ("no iopub message", iopub_seen))
                    if not future.done())
                raise RuntimeError(
                    f"Kernel didn't respond in {timeout:g} seconds ({missing}; "
                    f"{shell.asked} kernel_info requests on {shell.connections} "
                    "shell connection(s))")
            if not shell.answered.done() and now - shell.opened > REOPEN_AFTER:
                shell.reopen()
    finally:
        shell.close()
        if not iopub_seen.done():
            iopub_seen.cancel()
            with contextlib.suppress(BaseException):
                await iopub_seen
