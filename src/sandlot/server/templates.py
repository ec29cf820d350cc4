"""TemplateService: named images built from a base image plus set-up commands (``/v1/templates``).

sandlot has no fast-sandbox golden images; it keeps the released SDK's template API and builds
a template as a snapshot: a build sandbox of ``image`` (or of a snapshot, ``image`` =
``snapshot:<id>``) is started with the template's env and limits, its ``entrypoint`` (the
set-up command) runs to completion, then ``readiness.probe`` if given; both must exit 0. The
sandbox is then snapshotted and deleted. Phases: Pending -> Building -> Succeeded | Failed;
the build's output is kept (``GET /v1/templates/{id}/logs``; a failure's tail is also the
status message). ``templateId`` on create starts a sandbox from the template's snapshot.
``publish`` and ``format`` are recorded and echoed only: the result stays in this server's
data dir (the status message says so).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import uuid
from typing import Any

import httpx

from sandlot.errors import Conflict, InvalidRequest, NotFound, SandlotError
from sandlot.runtime.execd_client import DEFAULT_PORT, TOKEN_HEADER
from sandlot.server.api.schemas import CreateSandboxRequest, rfc3339
from sandlot.server.models import SandboxState, utcnow
from sandlot.server.sandbox_transport import SandboxTransport
from sandlot.server.service import SandboxService
from sandlot.server.snapshot_models import SnapshotState
from sandlot.server.snapshots import SnapshotService
from sandlot.server.store.templates import TemplateStore
from sandlot.server.tenancy.principal import owner_of_new, visible

log = logging.getLogger(__name__)
SNAPSHOT_SOURCE = "snapshot:"
BUILD_TIMEOUT = 1800.0  # seconds a set-up command may run
LOG_LIMIT = 256 * 1024  # bytes of build output kept
_PRIVATE = ("buildLog", "snapshotId", "owner")  # kept in the record, not in the API's answer


def _not_found(template_id: str) -> NotFound:
    return NotFound(f"template {template_id} not found", code="TEMPLATE_NOT_FOUND")


class TemplateService:
    def __init__(self, sandboxes: SandboxService, snapshots: SnapshotService,
                 store: TemplateStore) -> None:
        self.sandboxes = sandboxes
        self.snapshots = snapshots
        self.store = store
        self._records: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for rec in await self.store.load_all():
            self._records[rec["templateId"]] = rec
            if rec["status"]["phase"] in ("Pending", "Building"):  # its build died with us
                await self._phase(rec, "Failed", "the server stopped during the build")

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ----- queries ---------------------------------------------------------------------

    def get(self, template_id: str) -> dict[str, Any]:
        self.snapshots.require_support()
        rec = self._records.get(template_id)
        if rec is None or not visible(rec.get("owner")):  # another tenant's: as if unknown
            raise _not_found(template_id)
        return rec

    @staticmethod
    def public(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k not in _PRIVATE}

    def search(self, metadata: dict[str, str] | None) -> list[dict[str, Any]]:
        self.snapshots.require_support()
        items = [r for r in self._records.values()
                 if visible(r.get("owner"))
                 and all(r.get("metadata", {}).get(k) == v for k, v in (metadata or {}).items())]
        return sorted(items, key=lambda r: (r["createdAt"], r["templateId"]))

    def snapshot_for(self, template_id: str) -> tuple[str, dict[str, Any]]:
        """The snapshot a sandbox from ``template_id`` starts on (409 unless Succeeded)."""
        rec = self.get(template_id)
        if rec["status"]["phase"] != "Succeeded":
            raise Conflict(f"template {template_id} is {rec['status']['phase']}, not Succeeded",
                           code="TEMPLATE_NOT_READY")
        return rec["snapshotId"], rec

    # ----- create / build / delete -----------------------------------------------------

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.snapshots.require_support()
        image = body.get("image")
        if not isinstance(image, str) or not image.strip():
            raise InvalidRequest("image is required (a base image, or snapshot:<id>)")
        if image.startswith(SNAPSHOT_SOURCE):
            self.snapshots.ready(image[len(SNAPSHOT_SOURCE):])
        readiness = body.get("readiness") or {}
        now = rfc3339(utcnow())
        rec: dict[str, Any] = {
            "templateId": str(uuid.uuid4()), "image": image,
            "publish": str(body.get("publish") or ""), "format": body.get("format") or "native",
            "status": {"phase": "Pending", "message": "build accepted"},
            "createdAt": now, "updatedAt": now,
            "resourceLimits": dict(body.get("resourceLimits") or {}),
            "entrypoint": list(body.get("entrypoint") or []),
            "env": dict(body.get("env") or {}), "metadata": dict(body.get("metadata") or {}),
            "readiness": dict(readiness), "buildLog": "", "snapshotId": None,
            "owner": owner_of_new(),  # the build sandbox and the snapshot are its too
        }
        self._records[rec["templateId"]] = rec
        await self.store.save(rec["templateId"], rec)
        task = asyncio.create_task(self._build(rec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rec

    async def delete(self, template_id: str) -> None:
        """Remove the template and its snapshot (409 while building or while in use)."""
        rec = self.get(template_id)
        if rec["status"]["phase"] in ("Pending", "Building"):
            raise Conflict(f"template {template_id} is still being built",
                           code="TEMPLATE_BUILDING")
        if rec.get("snapshotId"):
            try:
                await self.snapshots.delete(rec["snapshotId"])
            except NotFound:
                pass
        self._records.pop(template_id, None)
        await self.store.delete(template_id)

    async def _phase(self, rec: dict[str, Any], phase: str, message: str) -> None:
        rec["status"] = {"phase": phase, "message": message}
        if rec.get("snapshotId") and phase == "Succeeded":
            rec["status"]["manifestRef"] = rec["snapshotId"]
        rec["updatedAt"] = rfc3339(utcnow())
        if rec["templateId"] in self._records:
            await self.store.save(rec["templateId"], rec)

    async def _build(self, rec: dict[str, Any]) -> None:
        sandbox_id: str | None = None
        try:
            await self._phase(rec, "Building", "starting the build sandbox")
            sandbox_id = await self._start_sandbox(rec)
            for what, cmd in (("set-up", rec["entrypoint"]),
                              ("readiness probe", [rec["readiness"].get("probe") or ""])):
                if cmd and any(cmd):
                    if what == "readiness probe" and rec["readiness"].get("warmupSeconds"):
                        await asyncio.sleep(int(rec["readiness"]["warmupSeconds"]))
                    await self._run(rec, sandbox_id, what, cmd)
            snap = await self.snapshots.create(sandbox_id, SandboxState.RUNNING,
                                               rec["image"], [], f"template-{rec['templateId']}",
                                               owner=rec.get("owner"))
            while snap.state == SnapshotState.CREATING:
                await asyncio.sleep(0.1)
            if snap.state != SnapshotState.READY:
                raise RuntimeError(f"snapshotting the build sandbox failed: {snap.message}")
            rec["snapshotId"] = snap.id
            await self._phase(rec, "Succeeded", "built as a snapshot in this server's data dir "
                              "(publish target and format are not used by sandlot)")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the build's failure is the template's state
            reason = exc.message if isinstance(exc, SandlotError) else str(exc)
            rec["buildLog"] = (rec["buildLog"] + f"\n[sandlot] build failed: {reason}\n")[
                -LOG_LIMIT:]
            await self._phase(rec, "Failed", rec["buildLog"][-2000:].strip())
        finally:
            if sandbox_id is not None:
                try:
                    await self.sandboxes.delete(sandbox_id, reason="template_build_done")
                except Exception:  # noqa: BLE001 - it expires anyway
                    log.warning("deleting build sandbox %s failed", sandbox_id, exc_info=True)

    async def _start_sandbox(self, rec: dict[str, Any]) -> str:
        body: dict[str, Any] = {
            "entrypoint": ["tail", "-f", "/dev/null"], "timeout": self._build_lifetime(),
            "resourceLimits": rec["resourceLimits"], "env": rec["env"],
            "metadata": {"sandlot.template-build": rec["templateId"]},
        }
        if rec["image"].startswith(SNAPSHOT_SOURCE):
            body["snapshotId"] = rec["image"][len(SNAPSHOT_SOURCE):]
        else:
            body["image"] = {"uri": rec["image"]}
        sandbox = await self.sandboxes.create(CreateSandboxRequest.model_validate(body))
        while sandbox.state == SandboxState.PENDING:
            await asyncio.sleep(0.1)
        if sandbox.state != SandboxState.RUNNING:
            raise RuntimeError(f"the build sandbox did not start: {sandbox.message}")
        return sandbox.id

    def _build_lifetime(self) -> int:
        """Seconds the build sandbox may live: the build's budget, within the server's cap."""
        wanted = int(BUILD_TIMEOUT) + 600
        cap = self.sandboxes.cfg.server.max_sandbox_timeout_seconds
        return max(60, min(wanted, cap)) if cap is not None else wanted

    async def _run(self, rec: dict[str, Any], sandbox_id: str, what: str,
                   argv: list[str]) -> None:
        """Run ``argv`` (one shell command line when it is one string) through execd."""
        command = argv[0] if len(argv) == 1 else shlex.join(argv)
        sandbox = self.sandboxes.get(sandbox_id)
        token = self.sandboxes.execd_token(sandbox)
        port = self.sandboxes.cfg.execd.port or DEFAULT_PORT

        async def connect(p: int) -> Any:
            return await self.sandboxes.connect(sandbox_id, p)

        exit_error: str | None = None
        async with httpx.AsyncClient(transport=SandboxTransport(connect), trust_env=False,
                                     timeout=httpx.Timeout(BUILD_TIMEOUT)) as client:
            async with client.stream("POST", f"http://execd:{port}/command",
                                     json={"command": command},
                                     headers={TOKEN_HEADER: token}) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"{what}: execd answered {resp.status_code}")
                async for line in resp.aiter_lines():
                    event = _event(line)
                    if event is None:
                        continue
                    if event.get("type") in ("stdout", "stderr"):
                        rec["buildLog"] = (rec["buildLog"] + str(event.get("text", "")) +
                                           ("" if str(event.get("text", "")).endswith("\n")
                                            else "\n"))[-LOG_LIMIT:]
                    elif event.get("type") == "error":
                        err = event.get("error") or {}
                        exit_error = f"{err.get('ename', 'error')} {err.get('evalue', '')}"
        if exit_error is not None:
            raise RuntimeError(f"{what} command failed ({exit_error.strip()})")


def _event(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if text.startswith("data:"):
        text = text[5:].strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


