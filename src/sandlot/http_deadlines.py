"""Deadlines for slow HTTP clients, for the uvicorn the API server runs (execd has its own
HTTP layer with the same deadlines, ``sandlot.execd.httpserver``).

uvicorn bounds only the wait between two requests of a kept-alive connection: a client that
connects and sends nothing, or trickles its request head a byte at a time (slowloris), or
stops half-way through a body, holds its connection (and a file handle) for ever. A handful
of local processes could so exhaust the server's descriptors. The protocol made here adds:

- a header deadline: from the connection's start (or a kept-alive request's first byte) the
  whole request head must arrive within ``header_timeout`` seconds;
- a body idle timeout: while a request body is being received, ``body_idle_timeout`` seconds
  without a byte close the connection (slow uploads that keep moving are not cut).

Past either, the connection is closed (what nginx's ``client_header_timeout`` and
``client_body_timeout`` do). Responses are not bounded: a command stream may be quiet.

It subclasses uvicorn's httptools protocol through the asyncio protocol callbacks and
httptools parser callbacks that class implements (public methods), adding timers only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _DeadlineProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_idle_timeout: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_body = False

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self._in_body and self.flow.read_paused:
            # uvicorn stopped reading because the app is not taking the body yet: the
            # slow side is this server (or a sandbox behind the proxy), not the client.
            self._arm(self.body_idle_timeout)
        elif not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_body:
            self._arm(self.body_idle_timeout)
        super().data_received(data)

    def on_message_begin(self) -> None:
        if self._deadline is None:  # a kept-alive connection's next request: a fresh deadline
            self._arm(self.header_timeout)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_body = True
        self._arm(self.body_idle_timeout)
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        self._in_body = False
        self._disarm()  # the WebSocket protocol takes the transport over
        super().handle_websocket_upgrade()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()


def deadline_protocol(header_timeout: float, body_idle_timeout: float) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class with these deadlines (``Config(http=...)``)."""
    return type("DeadlineHttpProtocol", (_DeadlineProtocol,),
                {"header_timeout": header_timeout, "body_idle_timeout": body_idle_timeout})
