"""Event streams as the OpenSandbox clients parse them (commands and code execution).

Framing: by default the reference execd's (``pkg/web/controller/sse.go``): each event is its
one-line JSON followed by a blank line, and a quiet stream carries ``ping`` events; a client
written against the reference parses exactly that. A client that asks for standard SSE
(``?sse=1``, or a ``Last-Event-ID`` header, see ``wants_sse``) gets ``id: <id>`` / ``data:
<json>`` frames and ``: keep-alive`` comments instead, so it can resume. Both released SDKs
read either (they strip an optional ``data:`` and skip ``id:`` and comment lines).

Event shapes (read from the released SDK's ``converter/event_node.py``): the JSON object has
``type`` (init | status | stdout | stderr | result | error | execution_complete |
execution_count | ping), ``timestamp`` (Unix ms, required by the SDK) and, per type:

- ``init``: ``text`` = the command's id, the session's id for a session run, the context's id
  for code (the SDK stores it as ``execution.id``)
- ``stdout`` / ``stderr`` / ``status``: ``text``
- ``result``: ``results`` = the MIME bundle with ``text/plain`` renamed ``text``
- ``error``: ``error`` = ``{"ename", "evalue", "traceback": [..]}``; for commands the SDK
  reads ``int(evalue)`` as the exit code
- ``execution_complete``: ``execution_time`` (ms)
- ``execution_count``: ``execution_count``

The JSON never contains a raw newline, so one line per event is enough.

Use::

    from sandlot.execd import sse
    async def body():
        yield sse.encode(sse.init_event(exec_id), event_id=1)
        yield sse.encode(sse.stdout_event("hi\\n"), event_id=2)
        yield sse.encode(sse.complete_event(12), event_id=3)
    return sse.sse_response(body(), keepalive_interval=15)

``sse_response`` interleaves keep-alives while the body is silent and stops the body
(``aclose``) when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sandlot.execd import bytescan

KEEPALIVE: bytes = b": keep-alive\n\n"
MEDIA_TYPE = "text/event-stream"
DEFAULT_KEEPALIVE_SECONDS = 15.0

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def now_ms() -> int:
    """Wall-clock Unix time in milliseconds (the events' ``timestamp``)."""
    return time.time_ns() // 1_000_000


def make_event(type_: str, **fields: Any) -> dict[str, Any]:
    """An event dict with ``type`` and ``timestamp``; ``None`` fields are dropped."""
    event: dict[str, Any] = {"type": type_, "timestamp": now_ms()}
    for key, value in fields.items():
        if value is not None:
            event[key] = value
    return event


def init_event(execution_id: str) -> dict[str, Any]:
    return make_event("init", text=execution_id)


def stdout_event(text: str) -> dict[str, Any]:
    return make_event("stdout", text=text)


def stderr_event(text: str) -> dict[str, Any]:
    return make_event("stderr", text=text)


def status_event(text: str) -> dict[str, Any]:
    return make_event("status", text=text)


def result_event(results: Mapping[str, Any], execution_count: int | None = None) -> dict[str, Any]:
    """A rich result; ``results`` maps MIME type to data (the SDK reads ``text``/``text/plain``)."""
    return make_event("result", results=dict(results), execution_count=execution_count)


def error_event(ename: str, evalue: str, traceback: list[str] | None = None) -> dict[str, Any]:
    return make_event(
        "error", error={"ename": ename, "evalue": evalue, "traceback": list(traceback or [])}
    )


def complete_event(execution_time_ms: int, **extra: Any) -> dict[str, Any]:
    """End of an execution; ``extra`` (e.g. ``exit_code``) is ignored by the SDK, kept for raw
    clients."""
    return make_event("execution_complete", execution_time=int(execution_time_ms), **extra)


def execution_count_event(count: int) -> dict[str, Any]:
    return make_event("execution_count", execution_count=count)


def ping_event() -> dict[str, Any]:
    return make_event("ping", text="pong")


# Characters that some line splitters (str.splitlines, hence some SSE clients) treat as line
# breaks although JSON leaves them unescaped; they can only occur inside JSON strings.
_LINE_BREAKERS = ("\x85", "\u2028", "\u2029")


def encode_data(event: Mapping[str, Any]) -> str:
    """The event's JSON text: one line, safe for every SSE line splitter."""
    data = _dumps(event)
    for ch in _LINE_BREAKERS:
        if ch in data:
            data = data.replace(ch, f"\\u{ord(ch):04x}")
    return data


# Control characters JSON must escape, other than the line terminator; the short escapes
# Python's JSON encoder uses, \u00XX for the rest (the same bytes it would write).
_SHORT_ESCAPES = {0x08: b"\\b", 0x09: b"\\t", 0x0C: b"\\f", 0x0D: b"\\r"}
_CONTROL_ESCAPES = {c: _SHORT_ESCAPES.get(c, b"\\u%04x" % c) for c in bytescan.CONTROLS}
_BREAKERS_UTF8 = tuple((ch.encode(), f"\\u{ord(ch):04x}".encode()) for ch in _LINE_BREAKERS)


def encode_region(type_: str, region: bytes, *, frames: bool = False) -> bytes:
    """The JSON events (one per line, ``\\n``-joined) of ``stdout``/``stderr`` events for the
    lines of ``region`` (each ends in ``\\n``, see ``lines.LineFramer``); a blank line is sent
    as ``"\\n"``, as the reference does. Invalid UTF-8 becomes U+FFFD. ``frames``: in the
    reference's framing instead, each event followed by a blank line (what the journal
    stores, so a stream's bytes are sent as they were written; see ``journal``)."""
    return encode_region_counted(type_, region, frames=frames)[0]


def encode_region_counted(type_: str, region: bytes, *, frames: bool = False
                          ) -> tuple[bytes, int]:
    """``encode_region`` and the number of lines (events) in ``region``.

    The whole region is escaped and cut into events with byte replaces (C speed) rather than
    a Python step per line, so a stream of many short lines stays cheap; that includes
    control characters (ANSI colours, backspaces): each that occurs is one more replace.
    Each pass over the bytes counts (profiled: a few tenths of a ms per MiB each on a stream
    of short lines), so the line count comes from the replace's length, the pieces are
    joined once (``a + b + c`` copies a 2 MiB result twice), and which control bytes occur
    and whether a line is blank are asked of ``bytescan`` (one SIMD pass each where it
    can)."""
    if not region:
        return b"", 0
    ascii_only = region.isascii()  # valid UTF-8 already: no decode needed (a copy)
    if not ascii_only:
        try:
            region.decode()
        except UnicodeDecodeError:
            region = region.decode(errors="replace").encode()
    escaped = region.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    for code in bytescan.controls_in(region):
        escaped = escaped.replace(bytes((code,)), _CONTROL_ESCAPES[code])
    if not ascii_only:
        for utf8, esc in _BREAKERS_UTF8:
            escaped = escaped.replace(utf8, esc)
    head = b'{"type":"%s","timestamp":%d,"text":"' % (type_.encode(), now_ms())
    end = b'"}\n\n' if frames else b'"}\n'
    # Each line's "\n" (the region's last one too) becomes the end of its event and the
    # start of the next; the start after the last line is cut off again.
    body = escaped.replace(b"\n", end + head)
    lines = (len(body) - len(escaped)) // (len(end) + len(head) - 1)
    cut = len(body) - len(head) - (0 if frames else 1)
    out = b"".join((head, memoryview(body)[:cut]))
    # A blank line's event has the empty text so far: its text is "\n". That whole event
    # (this region's timestamp, the empty text) cannot occur otherwise, since every quote of
    # the output's text is escaped. Whether there is one at all is asked of the region
    # (bytescan; searching the output for the event is slower: its head half-matches at
    # every line).
    if bytescan.has_blank_line(region):
        out = out.replace(head + b'"}', head + b'\\n"}')
    return out, lines


def encode_lines(type_: str, lines: list[bytes]) -> bytes:
    """``encode_region`` of ``lines`` (terminators already stripped)."""
    return encode_region(type_, b"".join(line + b"\n" for line in lines))


FRAME_END = b"\n\n"  # ends each event in the reference's framing (and in the journal)


def encode(
    event: Mapping[str, Any] | str, event_id: int | str | None = None, *, sse: bool = False
) -> bytes:
    """One frame; ``event`` may be a dict or already-encoded JSON text. ``sse``: a standard SSE
    frame (with ``event_id``), else the reference's (the JSON and a blank line)."""
    data = event if isinstance(event, str) else encode_data(event)
    if not sse:
        return f"{data}\n\n".encode()
    if event_id is None:
        return f"data: {data}\n\n".encode()
    return f"id: {event_id}\ndata: {data}\n\n".encode()


def ping_frame() -> bytes:
    """The reference's keep-alive: a ``ping`` event (ignored by the SDKs)."""
    return encode(ping_event())


def keepalive_frame(sse: bool) -> bytes:
    return KEEPALIVE if sse else ping_frame()


def wants_sse(request: Request) -> bool:
    """Whether the client asked for standard SSE framing (``?sse=1`` or ``Last-Event-ID``)."""
    flag = request.query_params.get("sse", "").lower()
    return flag in ("1", "true", "yes") or last_event_id(request) is not None


def last_event_id(request: Request) -> str | None:
    """The ``Last-Event-ID`` a reconnecting client sent (header, or ``lastEventId`` query)."""
    value = request.headers.get("last-event-id") or request.query_params.get("lastEventId")
    return value.strip() if value and value.strip() else None


async def with_keepalive(
    source: AsyncIterable[bytes],
    interval: float = DEFAULT_KEEPALIVE_SECONDS,
    frame: Callable[[], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """Yield ``source``'s chunks, plus a keep-alive (``frame()``, default ``KEEPALIVE``)
    whenever it is silent for ``interval`` s."""
    iterator = source.__aiter__()
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield frame() if frame is not None else KEEPALIVE
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield chunk
    finally:
        if pending is not None:
            pending.cancel()
            try:
                await pending
            except BaseException:  # noqa: BLE001 - the source is being abandoned
                pass
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


class _SelfEndingStream(StreamingResponse):
    """A ``text/event-stream`` of a source that ends by itself and is never silent for long
    (a journal follower sending its own keep-alives, or a fixed list of frames).

    Starlette's ``StreamingResponse`` watches for the client's disconnect in an anyio task
    group, which (with the anyio backend it imports) costs more than the rest of a short
    command's request. Here one plain task notices the disconnect, and the stream stops at
    its next chunk; the source closes (``aclose``) either way.
    """

    after: Callable[[], None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        gone = asyncio.ensure_future(_disconnected(receive))
        iterator = self.body_iterator
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if gone.done():
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if self.after is not None:
                # Next in the loop, not now: the stream's end is still held by the
                # connection's cork until a callback already queued sends it, and the
                # deferred work (creating files, ~1-2 ms) must not hold the end back.
                asyncio.get_running_loop().call_soon(self.after)
        finally:
            gone.cancel()
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def self_ending_sse_response(
    source: AsyncIterable[bytes], *, after: Callable[[], None] | None = None
) -> StreamingResponse:
    """A ``text/event-stream`` response for a source that needs no keep-alive wrapper and ends
    by itself (see ``_SelfEndingStream``); ``sse_response`` for any other source. ``after``
    runs once the whole stream has been handed to the connection and sent (deferred work)."""
    response = _SelfEndingStream(source, media_type=MEDIA_TYPE, headers=dict(_HEADERS))
    response.after = after
    return response


class _InterruptibleStream(StreamingResponse):
    """A ``text/event-stream`` whose source must stop at once when the client goes away (a
    code cell is interrupted then). As Starlette's ``StreamingResponse`` does with an anyio
    task group and cancel scopes, but with two plain tasks: the body pump and the
    disconnect watch, whichever ends first ends the other."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not pump.done():
                pump.cancel()  # the client went away: the source's clean-up runs now
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
        if not pump.cancelled():
            pump.result()  # the pump's own error, if any

    async def _pump(self, send: Send) -> None:
        iterator = self.body_iterator
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for chunk in iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def interruptible_sse_response(source: AsyncIterable[bytes]) -> StreamingResponse:
    """A ``text/event-stream`` response whose source is cancelled as soon as the client
    disconnects (see ``_InterruptibleStream``); the source sends its own keep-alives."""
    return _InterruptibleStream(source, media_type=MEDIA_TYPE, headers=dict(_HEADERS))


_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(
    source: AsyncIterable[bytes],
    *,
    keepalive_interval: float | None = DEFAULT_KEEPALIVE_SECONDS,
    headers: Mapping[str, str] | None = None,
    status_code: int = 200,
    keepalive: Callable[[], bytes] | None = None,
) -> StreamingResponse:
    """A streaming ``text/event-stream`` response (no proxy buffering, no caching);
    ``keepalive`` makes the keep-alive frame (default the SSE comment)."""
    all_headers = dict(_HEADERS)
    if headers:
        all_headers.update(headers)
    body = (
        source if not keepalive_interval
        else with_keepalive(source, keepalive_interval, keepalive)
    )
    return StreamingResponse(
        body, status_code=status_code, media_type=MEDIA_TYPE, headers=all_headers
    )
