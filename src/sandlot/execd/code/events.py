"""Turns kernel output into the contract's stream events, enforcing the size caps.

Event shapes are those the released SDK parses and the reference execd sends
(``pkg/web/controller/sse.go``, ``pkg/runtime/jupyter.go``): ``type``, ``timestamp`` (Unix ms)
and one of ``text``, ``results`` (a MIME bundle whose ``text/plain`` entry is renamed ``text``,
the field the SDK reads), ``error`` ``{ename, evalue, traceback}`` (preceded by a ``status``
event ``error``), ``execution_count`` (only just before the ``result`` of an
``execute_result``, with its count), ``execution_time``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .kernels.base import Output

Event = dict[str, Any]


def now_ms() -> int:
    return int(time.time() * 1000)


def event(kind: str, **fields: Any) -> Event:
    return {"type": kind, "timestamp": now_ms(), **fields}


def error_event(ename: str, evalue: str, traceback: list[str] | None = None) -> Event:
    return event("error", error={"ename": ename, "evalue": evalue, "traceback": traceback or []})


def truncation_marker(dropped_from: int) -> str:
    return f"\n[output truncated: limit of {dropped_from} bytes reached, the rest was dropped]\n"


class EventShaper:
    """Per-execution state: the output budget, the execution count, whether an error was seen."""

    def __init__(self, max_output: int, max_result: int):
        self._max_output = max_output
        self._max_result = max_result
        self._used = 0
        self._truncated = False
        self.execution_count: int | None = None
        self.error: Event | None = None

    def shape(self, out: Output) -> list[Event]:
        if out.kind in ("stdout", "stderr"):
            return self._stream(out.kind, out.text)
        if out.kind == "result":
            shaped = [event("result", results=self._bundle(out.data))]
            if out.count:
                self.execution_count = int(out.count)
                shaped.insert(0, event("execution_count", execution_count=self.execution_count))
            return shaped
        if out.kind == "error":
            self.error = error_event(out.ename, out.evalue, out.traceback)
            return [event("status", text="error"), self.error]
        if out.kind == "count":  # the reference sends no event for execute_input's count
            if out.count is not None:
                self.execution_count = int(out.count)
            return []
        return []

    def _stream(self, kind: str, text: str) -> list[Event]:
        if self._truncated or not text:
            return []
        data = text.encode("utf-8", "replace")
        room = self._max_output - self._used
        if len(data) <= room:
            self._used += len(data)
            return [event(kind, text=text)]
        self._truncated = True
        head = data[:max(room, 0)].decode("utf-8", "ignore")
        self._used = self._max_output
        return [event(kind, text=head + truncation_marker(self._max_output))]

    def _bundle(self, data: dict[str, Any]) -> dict[str, Any]:
        bundle: dict[str, Any] = {}
        # text/plain first, so a note about a dropped entry is not overwritten by it.
        for mime, value in sorted(data.items(), key=lambda kv: kv[0] != "text/plain"):
            size = len(value.encode()) if isinstance(value, str) else len(json.dumps(value))
            if size <= self._max_result:
                bundle[mime] = value
            elif isinstance(value, str) and (mime.startswith("text/") or mime.endswith("+xml")):
                cut = value.encode()[: self._max_result].decode("utf-8", "ignore")
                bundle[mime] = cut + truncation_marker(self._max_result)
            else:
                # Binary (base64) or structured data cannot be cut meaningfully: say it was dropped.
                note = (f"[{mime} output of {size} bytes dropped: "
                        f"over the {self._max_result}-byte limit]")
                plain = bundle.get("text/plain") or data.get("text/plain") or ""
                bundle["text/plain"] = f"{plain}\n{note}".strip()
        if "text/plain" in bundle:  # renamed, as the reference does
            bundle["text"] = bundle.pop("text/plain")
        return bundle
