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
the loop's own poll (drained after every send, which can consume the socket's wake-up) and
closed once the kernel is ready, so the client's shell socket never holds their replies.
A kernel whose iopub has spoken but whose shell has not answered on that connection within
``REOPEN_AFTER`` seconds more (or at all within ``REOPEN_IDLE``) is asked on a new one.
About 1 in 1,000 starts under load (``tools/repro_first_cell_stall.py``) ended with the
kernel idle, iopub talking and the shell never answering, until the 60 s start timeout;
the likely cause is a ROUTER that missed its descriptor's wake-up (requests sit unread),
and a ROUTER reads what is queued when a new peer connects.
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
# Seconds without a shell reply on a connection before asking on a new one: once iopub has
# shown the kernel running (its shell answers within moments of that, even on a loaded
# machine), and in any case (a start that is merely slow is not harmed by a new connection).
REOPEN_AFTER = 2.0
REOPEN_IDLE = 15.0

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
    started = time.monotonic()
    deadline = started + timeout
    iopub_at: float | None = None  # when iopub first delivered a message
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
                iopub_at = iopub_at or time.monotonic()
            if shell.answered.done() and iopub_seen.done():
                if shell.connections > 1:
                    log.warning("kernel answered kernel_info after %.1f s, on shell "
                                "connection %d (%d requests; iopub spoke %.1f s before)",
                                time.monotonic() - started, shell.connections, shell.asked,
                                time.monotonic() - (iopub_at or started))
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
            unanswered = now - max(shell.opened, iopub_at or now)
            if not shell.answered.done() and (
                    (iopub_at is not None and unanswered > REOPEN_AFTER)
                    or now - shell.opened > REOPEN_IDLE):
                shell.reopen()
    finally:
        shell.close()
        if not iopub_seen.done():
            iopub_seen.cancel()
            with contextlib.suppress(BaseException):
                await iopub_seen
