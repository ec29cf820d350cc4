"""A kernel socket's messages (iopub, or readiness's own shell connection) read on the event
loop's own poll, without pyzmq's asyncio layer.

``zmq.asyncio``'s ``recv_multipart`` makes a future per receive, registers it, polls the
socket's events and resolves the future in a later loop pass: in the profile of warm
``1+1`` runs (``docs/profiles/2026-12-02-code-warm-execd-gil-after.txt``) that layer was a
fifth of execd's CPU, for four small messages per run. Here the socket's file descriptor
is watched by the loop itself (``add_reader``) and every message queued when it signals is
received at once, without blocking, and handed to the run's handler in the same callback.

ZeroMQ's descriptor only says "the socket's state changed": it is cleared by reading the
socket's ``EVENTS``, and a message can wait in the socket without it signalling again. So
every callback (and every new handler) drains the socket until ``zmq.Again``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import zmq

from . import wire

# Called with each parsed message; a handler returns True when it wants no more messages.
Handler = Callable[[dict[str, Any]], bool]

log = logging.getLogger(__name__)


class SocketListener:
    """A kernel socket made for this listener (``connect_iopub``'s or ``connect_shell``'s,
    used only through a plain shadow of it and closed with the listener), its messages
    parsed with ``session`` and given to the current handler.

    Messages that arrive while no handler is set are received and dropped (readiness
    statuses, a run's late stragglers): none of them belongs to a later run."""

    def __init__(self, owner: Any, session: Any) -> None:
        self._owner = owner  # the socket as jupyter_client made it: it owns the ZMQ socket
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(owner.underlying)
        self._session = session
        self._fd: int | None = self._sock.FD
        self._loop = asyncio.get_running_loop()
        self._handler: Handler | None = None
        self._seen: asyncio.Future[None] | None = None
        self._loop.add_reader(self._sock.FD, self._drain)

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The plain shadow of the socket (to send on it; receiving is the listener's)."""
        return self._sock

    def first(self) -> asyncio.Future[None]:
        """A future resolved when the next message has been received (readiness's proofs)."""
        self._seen = self._loop.create_future()
        self._drain()
        return self._seen

    def listen(self, handler: Handler | None) -> None:
        """Hand each message from now on to ``handler`` (None: drop them) until it returns
        True. Set it in the step that sends the request: the loop's callback takes (and
        without a handler drops) whatever arrives in between."""
        self._handler = handler
        if handler is not None:
            self._drain()

    def drain(self) -> None:
        """Take what is queued now: the waits call it on their timeouts, so a wake-up the
        descriptor missed (it is cleared by any command processing) cannot stall them."""
        self._drain()

    def _drain(self) -> None:
        sock = self._sock
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                self.close()
                return
            if self._seen is not None and not self._seen.done():
                self._seen.set_result(None)
            handler = self._handler
            if handler is None:
                continue
            try:
                msg = wire.parse(self._session, frames)
            except (ValueError, TypeError) as exc:  # unsigned or malformed: not the kernel's
                log.warning("dropped an iopub message: %s", exc)
                continue
            if handler(msg):
                self._handler = None

    def close(self) -> None:
        if self._fd is None:
            return
        self._loop.remove_reader(self._fd)
        self._fd = None
        self._handler = None
        self._owner.close(linger=0)
