"""DiagnosticsService: what ``GET /v1/sandboxes/{id}/diagnostics/*`` answers.

Logs are the workload's entrypoint output (served by the sandbox's execd from its own tmpfs)
and the container init's output (kept by the runtime); events are what ``EventRecorder`` and
``SandboxMonitor`` stored. When a sandbox's container is removed its last logs are copied to
the store first (``before_delete``), so both stay readable after the end for
``[diagnostics] retention_seconds``.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sandlot.errors import InvalidRequest, NotFound, SandlotError
from sandlot.execd.protocol import ENTRYPOINT_LOG, KERNEL_LOG, parse_entrypoint_exit
from sandlot.runtime import execd_client
from sandlot.server import codes
from sandlot.server.event_recorder import NORMAL, WARNING, EventRecorder
from sandlot.server.models import SandboxRecord, SandboxState
from sandlot.server.observers import LifecycleObserver
from sandlot.server.sandbox_monitor import SandboxMonitor
from sandlot.server.store.events import Event, FinalLogs
from sandlot.server.tenancy import principal as tenancy

if TYPE_CHECKING:
    from sandlot.server.service import SandboxService

LOG_SCOPES = ("container", "all")
EVENT_SCOPES = ("runtime", "all")
CONTENT_TYPE = "text/plain; charset=utf-8"
_EXECD_TIMEOUT = 3.0
_MAX_EVENTS = 5000
# States in which execd can answer (a paused sandbox's processes are frozen; a Stopping one's
# execd still runs while its last logs are copied).
_EXECD_STATES = (SandboxState.RUNNING, SandboxState.PENDING, SandboxState.STOPPING)


async def _nothing() -> None:
    """An awaitable of no log (a sandbox whose execd is not asked)."""
    return None


@dataclass
class Content:
    """One diagnostics answer before it is shaped for the wire."""

    text: str
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_events(events: list[Event]) -> str:
    return "".join(f"{_iso(e.at)} runtime {e.level} {e.kind} {e.message}\n" for e in events)


def _tail(text: str, max_bytes: int) -> tuple[str, bool]:
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text, False
    cut = raw[-max_bytes:]
    if b"\n" in cut:
        cut = cut.partition(b"\n")[2]
    return cut.decode(errors="replace"), True


class DiagnosticsService(LifecycleObserver):
    def __init__(self, service: SandboxService, recorder: EventRecorder,
                 monitor: SandboxMonitor, max_bytes: int) -> None:
        """``max_bytes``: the most of a payload collected (and kept after the end); the inline
        limit, or the URL one when payloads may go by URL."""
        self.service = service
        self.recorder = recorder
        self.monitor = monitor
        self.max_bytes = max_bytes
        self._exit_seen: dict[str, str] = {}

    # ----- what the routes call ----------------------------------------------------------

    async def context(self, sandbox_id: str) -> dict[str, Any]:
        rec = await self._lookup(sandbox_id)
        runtime = self.service.runtime
        if rec is None or rec.state == SandboxState.TERMINATED:
            await self._require_known(sandbox_id)
            return {"sandboxId": sandbox_id, "backend": runtime.name, "identifiers": {},
                    "state": SandboxState.TERMINATED.value}
        return {"sandboxId": sandbox_id, "backend": runtime.name,
                "identifiers": runtime.diagnostic_ids(sandbox_id), "state": rec.state.value}

    async def logs(self, sandbox_id: str, scope: str) -> Content:
        if scope not in LOG_SCOPES:
            raise _scope_error("logs", scope, LOG_SCOPES)
        content = await self._container_logs(sandbox_id)
        if scope == "all":
            rec = await self._lookup(sandbox_id)
            status = (f"state {rec.state.value}, reason {rec.reason or '-'}: "
                      f"{rec.message or ''}" if rec is not None else "state Terminated")
            content.text = f"=== sandbox {sandbox_id}: {status}\n" + content.text
        content.text, cut = _tail(content.text, self.max_bytes)
        content.truncated = content.truncated or cut
        return content

    async def events(self, sandbox_id: str, scope: str, limit: int = _MAX_EVENTS) -> Content:
        if scope not in EVENT_SCOPES:
            raise _scope_error("events", scope, EVENT_SCOPES)
        rec = await self._lookup(sandbox_id)
        warnings: list[str] = []
        if rec is not None and rec.state != SandboxState.TERMINATED:
            await self.observe(rec, warnings)
        await self.recorder.flush()
        events = await self.recorder.store.list(sandbox_id, limit)
        if not events and (rec is None or rec.state == SandboxState.TERMINATED):
            raise _not_found(sandbox_id)
        text = render_events(events)
        if scope == "all":
            sample = self.monitor.latest(sandbox_id)
            if sample is not None:
                u = sample.usage
                cpu = f"{u.cpu_seconds:.2f}s" if u.cpu_seconds is not None else "unknown"
                mem = (f"{u.memory_bytes / (1 << 20):.1f} MiB"
                       if u.memory_bytes is not None else "unknown")
                text += (f"{_iso(sample.at)} usage {NORMAL} Sampled cpu {cpu}, memory {mem}, "
                         f"oom kills {u.oom_kills}\n")
        total = await self.recorder.store.count(sandbox_id)
        text, cut = _tail(text, self.max_bytes)
        if total > limit:
            warnings.append(f"only the newest {limit} of {total} events are shown")
        return Content(text, cut or total > limit, warnings)

    async def legacy_logs(self, sandbox_id: str, tail: int, since: str | None) -> str:
        """The deprecated plain-text logs (``osb devops logs``): the last ``tail`` lines."""
        content = await self._container_logs(sandbox_id)
        lines = content.text.splitlines()
        if since is not None:
            _parse_since(since)  # only validated: the entrypoint log carries no timestamps
        return "\n".join(lines[-tail:]) + "\n" if lines else "(no logs)\n"

    async def legacy_events(self, sandbox_id: str, limit: int) -> str:
        content = await self.events(sandbox_id, "runtime", limit)
        return content.text or "(no events)\n"

    async def inspect(self, sandbox_id: str) -> str:
        """``osb devops inspect``: the sandbox's record, backend ids and resource usage."""
        ctx = await self.context(sandbox_id)
        rec = await self._lookup(sandbox_id)
        lines = [f"Sandbox ID:     {sandbox_id}", f"Backend:        {ctx['backend']}",
                 f"State:          {ctx['state']}"]
        if rec is not None:
            lines += [
                f"Reason:         {rec.reason or '-'}",
                f"Message:        {rec.message or '-'}",
                f"Image:          {rec.image_uri}",
                f"Entrypoint:     {' '.join(rec.entrypoint)}",
                f"Created At:     {rec.created_at.isoformat()}",
                f"Last Change:    {rec.last_transition_at.isoformat()}",
                f"Expires At:     {rec.expires_at.isoformat() if rec.expires_at else '-'}",
                f"Limits:         {', '.join(f'{k}={v}' for k, v in rec.resource_limits.items())}",
            ]
        for key, value in ctx["identifiers"].items():
            lines.append(f"{key + ':':<16}{value}")
        sample = (await self.monitor.sample(sandbox_id)
                  if rec is not None and rec.state != SandboxState.TERMINATED else None)
        if sample is not None:
            u = sample.usage
            lines += [
                f"CPU Seconds:    {u.cpu_seconds if u.cpu_seconds is not None else '-'}",
                f"Memory Bytes:   {u.memory_bytes if u.memory_bytes is not None else '-'}",
                f"Memory Limit:   {u.memory_limit_bytes or '-'}",
                f"OOM Kills:      {u.oom_kills}",
            ]
        exit_line = self._exit_seen.get(sandbox_id)
        if exit_line:
            lines.append(f"Entrypoint:     {exit_line}")
        return "\n".join(lines) + "\n"

    async def summary(self, sandbox_id: str, tail: int, event_limit: int) -> str:
        rule = "=" * 72
        part = "-" * 40
        sections = [rule, "SANDBOX DIAGNOSTICS SUMMARY", f"Sandbox ID: {sandbox_id}", rule,
                    "", part, "INSPECT", part, await self.inspect(sandbox_id),
                    "", part, "EVENTS", part, await self.legacy_events(sandbox_id, event_limit),
                    "", part, f"LOGS (last {tail} lines)", part,
                    await self.legacy_logs(sandbox_id, tail, None)]
        return "\n".join(sections) + "\n"

    # ----- observing a live sandbox ------------------------------------------------------

    async def observe(self, rec: SandboxRecord, warnings: list[str] | None = None) -> None:
        """Record what the sandbox shows now: an OOM kill, its entrypoint's end."""
        await self.monitor.sample(rec.id)
        if rec.state in _EXECD_STATES:
            found = await self._entrypoint_log(rec, 4096, warnings)
            if found is not None:
                self._note_exit(rec.id, found[0].decode(errors="replace"))

    def _note_exit(self, sandbox_id: str, log_tail: str) -> None:
        ended = parse_entrypoint_exit(log_tail)
        if ended is None or self._exit_seen.get(sandbox_id) == ended:
            return
        self._exit_seen[sandbox_id] = ended
        level = NORMAL if ended == "exited with code 0" else WARNING
        kind = "EntrypointExited" if ended.startswith("exited") else "EntrypointKilled"
        self.recorder.record(sandbox_id, kind, f"The sandbox's entrypoint {ended}", level)

    def recovered(self, rec: SandboxRecord) -> None:
        # OOM kills counted before the restart were recorded then.
        self.monitor.take_baseline(rec.id)

    async def before_delete(self, rec: SandboxRecord) -> None:
        """Copy the last logs to the store: the container's files go with it."""
        try:
            async with asyncio.timeout(2 * _EXECD_TIMEOUT):
                await self.monitor.sample(rec.id)  # a last OOM kill
                content = await self._live_logs(rec)  # notes the entrypoint's end too
        except TimeoutError:
            return
        self.monitor.forget(rec.id)
        self._exit_seen.pop(rec.id, None)
        if content.text:
            self.recorder.keep_logs(rec.id, FinalLogs(time.time(), content.text,
                                                      content.truncated))

    # ----- reading logs ------------------------------------------------------------------

    async def _container_logs(self, sandbox_id: str) -> Content:
        rec = await self._lookup(sandbox_id)
        if rec is not None and rec.state == SandboxState.FAILED:
            # Its container was removed when it failed: what was kept then, if anything.
            await self.recorder.flush()
            kept = await self.recorder.store.final_logs(sandbox_id)
            if kept is not None:
                return Content(kept.content, kept.truncated,
                               [f"the sandbox has failed; logs as kept at "
                                f"{_iso(kept.captured_at)}"])
        if rec is not None and rec.state != SandboxState.TERMINATED:
            return await self._live_logs(rec)
        await self.recorder.flush()
        final = await self.recorder.store.final_logs(sandbox_id)
        if final is None:
            await self._require_known(sandbox_id)
            return Content("", False, ["the sandbox has ended and no logs were kept"])
        return Content(final.content, final.truncated,
                       [f"the sandbox has ended; logs as kept at {_iso(final.captured_at)}"])

    async def _live_logs(self, rec: SandboxRecord) -> Content:
        """The entrypoint's and the code kernels' logs (through execd) and the container's
        own output, read at once: in a delete they are its last step before the teardown,
        and one after the other they cost a round trip into the sandbox each."""
        warnings: list[str] = []
        truncated = False
        parts: list[str] = []
        entry_warnings: list[str] = []
        in_execd = rec.state in _EXECD_STATES
        entry, kernels, (init, init_warning) = await asyncio.gather(
            self._entrypoint_log(rec, self.max_bytes, entry_warnings) if in_execd
            else _nothing(),
            # No warning of its own (most sandboxes never start a kernel, so there is often
            # no such log); kept only from an execd that answered the entrypoint's request.
            self._sandbox_log(rec, KERNEL_LOG, "code kernels'", self.max_bytes, None)
            if in_execd else _nothing(),
            self._init_log(rec),
        )
        if in_execd:
            warnings += entry_warnings
        else:
            warnings.append(f"the sandbox is {rec.state.value}: its entrypoint output can be "
                            "read while it runs")
        if entry is not None:
            text = entry[0].decode(errors="replace")
            self._note_exit(rec.id, text)
            truncated |= entry[1]
            parts.append(f"=== entrypoint output ({' '.join(rec.entrypoint)})\n{text}")
        if kernels is not None and kernels[0] and not entry_warnings:
            truncated |= kernels[1]
            parts.append("=== code kernels' own output\n" + kernels[0].decode(errors="replace"))
        if init_warning is not None:
            warnings.append(init_warning)
        if init is not None and init[0]:
            truncated |= init[1]
            parts.append("=== container init (execd) output\n"
                         + init[0].decode(errors="replace"))
        text = "".join(p if p.endswith("\n") else p + "\n" for p in parts)
        return Content(text, truncated, warnings)

    async def _init_log(self, rec: SandboxRecord) -> tuple[tuple[bytes, bool] | None, str | None]:
        """The container's own output (runc's stdio file) and a warning if unreadable."""
        try:
            return await self.service.runtime.init_log(rec.id, self.max_bytes), None
        except Exception as exc:  # noqa: BLE001 - reported, the rest is still useful
            return None, f"the container's own output cannot be read: {exc}"

    async def _entrypoint_log(self, rec: SandboxRecord, max_bytes: int,
                              warnings: list[str] | None) -> tuple[bytes, bool] | None:
        """The tail of the entrypoint log, read through the sandbox's execd."""
        return await self._sandbox_log(rec, ENTRYPOINT_LOG, "entrypoint", max_bytes, warnings)

    async def _sandbox_log(self, rec: SandboxRecord, path: str, what: str, max_bytes: int,
                           warnings: list[str] | None) -> tuple[bytes, bool] | None:
        """The tail of a log file in the sandbox (``what`` names it in warnings), read
        through the sandbox's execd; None when there is none."""
        sid = rec.id
        port = self.service.cfg.execd.port
        try:
            status, body = await execd_client.request(
                lambda: self.service.runtime.connect(sid, port), "GET",
                f"/files/download?path={path}",
                token=self.service.execd_token(rec), timeout=_EXECD_TIMEOUT,
                headers={"Range": f"bytes=-{max_bytes}"}, max_body=max_bytes + 4096)
        except (OSError, TimeoutError, SandlotError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as exc:
            if warnings is not None:
                warnings.append(f"the sandbox's execd did not answer ({exc or type(exc).__name__}"
                                f"): {what} output is missing")
            return None
        if status == 206:
            cut = len(body) >= max_bytes
            if cut and b"\n" in body:
                body = body.partition(b"\n")[2]
            return body, cut
        if status in (200, 416):
            return (body if status == 200 else b""), False
        if status == 404:
            return None  # no entrypoint of its own (the idle default), no kernel started
        if warnings is not None:
            warnings.append(f"the sandbox's execd answered {status} for the {what} log")
        return None

    async def _require_known(self, sandbox_id: str) -> None:
        await self.recorder.flush()
        if await self.recorder.store.count(sandbox_id) == 0:
            raise _not_found(sandbox_id)

    async def _lookup(self, sandbox_id: str) -> SandboxRecord | None:
        """The live record (None for an ended sandbox with kept events); 404 for an unknown
        sandbox and for another tenant's, live or ended (existence must not leak)."""
        rec = self.service.record(sandbox_id)
        if rec is not None and rec.state != SandboxState.TERMINATED:
            if not tenancy.visible(rec.owner):
                raise _not_found(sandbox_id)
            return rec
        await self.recorder.flush()
        kept, owner = await self.recorder.store.owner(sandbox_id)
        if not kept or not tenancy.visible(owner):
            raise _not_found(sandbox_id)
        return None


def _not_found(sandbox_id: str) -> NotFound:
    return NotFound(f"Sandbox {sandbox_id} not found.", code=codes.SANDBOX_NOT_FOUND)


def _scope_error(kind: str, scope: str, supported: tuple[str, ...]) -> InvalidRequest:
    return InvalidRequest(
        f"diagnostic {kind} scope {scope!r} is not supported by this server; supported "
        f"scopes: {', '.join(supported)}",
        code=codes.DIAGNOSTICS_SCOPE_UNSUPPORTED)


def _parse_since(since: str) -> float:
    m = re.fullmatch(r"(\d+)\s*([smhd])", since.strip().lower())
    if not m:
        raise InvalidRequest(f"since must be a duration such as 10m or 1h, not {since!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
