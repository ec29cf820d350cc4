"""Start-up reconciliation: make the store and the runtime agree after a restart or crash.

Rules: a record whose container vanished becomes ``Failed`` (never silently dropped);
a container without a live record is deleted; expired sandboxes are reaped; interrupted
deletes are finished; interrupted creates fail (their half-made container is removed);
endpoint listeners reopen on the ports clients were given before; expiry timers are re-armed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from sandlot.bounded import each_bounded
from sandlot.runtime.base import ContainerInfo, ContainerState
from sandlot.server import codes
from sandlot.server.models import SandboxRecord, SandboxState, utcnow

if TYPE_CHECKING:
    from sandlot.server.service import SandboxService

log = logging.getLogger(__name__)
T = TypeVar("T")

_LIVE_STATES = {
    SandboxState.RUNNING,
    SandboxState.PAUSING,
    SandboxState.PAUSED,
    SandboxState.RESUMING,
}


# A live record whose container the runtime reports stopped is asked about again this many
# times, this far apart, before it is failed: runsc derives "stopped" from a signal-0 call
# into the sandbox, which a loaded host can fail once while the sandbox is running.
STOPPED_CONFIRMATIONS = 3
STOPPED_CONFIRM_PAUSE = 0.5

# Records (and orphans) reconciled at once: each is a runtime inspect or a teardown of
# its own sandbox (a few host tools that mostly wait); one by one, a restart after a crash
# kept the API down ~1 s per interrupted create on a loaded host.
PARALLEL = 8


async def _bounded(items: Iterable[T], work: Callable[[T], Awaitable[None]]) -> None:
    """``work`` on every item, ``PARALLEL`` at a time; the first failure is raised after
    all have run (as the one-by-one loop raised it, minus the items it skipped)."""
    failed = await each_bounded(items, work, PARALLEL)
    if failed:
        raise failed[0][1]


async def reconcile(svc: SandboxService) -> None:
    runtime_ids = await svc.runtime.list_ids()
    now = utcnow()

    async def record(rec: SandboxRecord) -> None:
        await _reconcile_record(svc, rec, now)

    await _bounded(svc.records(), record)

    async def orphan(cid: str) -> None:
        log.warning("deleting orphaned container %s (no record in the store)", cid)
        try:
            await svc.runtime.delete(cid)
        except Exception:
            log.exception("could not delete orphaned container %s", cid)

    known = {rec.id for rec in svc.records()}
    await _bounded(sorted(runtime_ids - known), orphan)

    for (sandbox_id, port), host_port in (await svc.store.endpoint_ports()).items():
        live = svc.record(sandbox_id)
        if live is None or live.state not in _LIVE_STATES:
            continue
        try:
            await svc.open_endpoint(sandbox_id, port, preferred=host_port)
        except OSError:
            log.exception("could not reopen endpoint %s:%s", sandbox_id, port)


async def _finish_delete(svc: SandboxService, rec: SandboxRecord, reason: str) -> None:
    try:
        await svc.terminate(rec, reason)
    except Exception:  # recorded as Failed/DeleteFailed by _terminate; keep starting up
        log.exception("could not finish deleting %s", rec.id)


async def _confirmed_inspect(svc: SandboxService, sandbox_id: str) -> ContainerInfo:
    """The runtime's answer, asked again while it says stopped (see STOPPED_CONFIRMATIONS);
    a missing container is final."""
    info = await svc.runtime.inspect(sandbox_id)
    for _ in range(STOPPED_CONFIRMATIONS):
        if info.state != ContainerState.STOPPED:
            break
        await asyncio.sleep(STOPPED_CONFIRM_PAUSE)
        info = await svc.runtime.inspect(sandbox_id)
    return info


async def _reconcile_record(svc: SandboxService, rec: SandboxRecord, now: datetime) -> None:
    if rec.state in (SandboxState.STOPPING, SandboxState.TERMINATED):
        await _finish_delete(svc, rec, rec.reason or "user_delete")
        return
    if rec.expires_at is not None and rec.expires_at <= now:
        await svc.set_state(rec, SandboxState.STOPPING, "ttl_expiry",
                            "expired while the server was down")
        await _finish_delete(svc, rec, "ttl_expiry")
        return
    if rec.state == SandboxState.PENDING:
        with contextlib.suppress(Exception):
            await svc.runtime.delete(rec.id)
        await svc.set_state(
            rec,
            SandboxState.FAILED,
            codes.PROVISIONING_ERROR,
            "The server stopped while this sandbox was being created.",
        )
    elif rec.state in _LIVE_STATES:
        try:
            info = await _confirmed_inspect(svc, rec.id)
        except Exception:  # noqa: BLE001 - unknown is not gone: keep it, keep starting up
            log.exception("could not inspect %s at start-up; its state is left as %s",
                          rec.id, rec.state.value)
            svc.expiry.schedule(rec.id, rec.expires_at)
            return
        if info.state in (ContainerState.RUNNING, ContainerState.PAUSED):
            svc.observers.recovered(rec)
        if info.state == ContainerState.RUNNING:
            if rec.state != SandboxState.RUNNING:
                await svc.set_state(
                    rec, SandboxState.RUNNING, codes.RUNNING, codes.RUNNING_MESSAGE
                )
        elif info.state == ContainerState.PAUSED:
            if rec.state != SandboxState.PAUSED:
                await svc.set_state(
                    rec, SandboxState.PAUSED, codes.PAUSED, codes.PAUSED_MESSAGE
                )
        elif info.state == ContainerState.MISSING:
            await svc.set_state(
                rec,
                SandboxState.FAILED,
                codes.EXITED_ERROR,
                codes.with_reason("Sandbox container no longer exists in the runtime.", info),
            )
        else:
            with contextlib.suppress(Exception):
                await svc.runtime.delete(rec.id)
            await svc.set_state(
                rec,
                SandboxState.FAILED,
                codes.EXITED_ERROR,
                codes.with_reason(
                    f"Sandbox container exited with code {info.exit_code}."
                    if info.exit_code is not None
                    else "Sandbox container is no longer running.", info),
            )
    svc.expiry.schedule(rec.id, rec.expires_at)
