"""SandboxService: the lifecycle rules (states, expiry, limits, endpoints) in one place.

Routes call it and nothing else; it keeps the live records in memory, writes every change
through to the store, and drives the runtime. Creation returns at once with a ``Pending``
record; provisioning (image, container, execd readiness) runs in a background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sandlot.config import Config, TracingConfig
from sandlot.errors import (
    Conflict,
    ImageNotFound,
    ImagePullError,
    InvalidRequest,
    NotFound,
    RuntimeFailure,
    SandlotError,
    Unsupported,
)
from sandlot.jupyter_token import JUPYTER_PORT
from sandlot.jupyter_token import endpoint_headers as jupyter_endpoint_headers
from sandlot.net import egress_api
from sandlot.net.policy import EgressPolicy, parse_policy
from sandlot.runtime import execd_client
from sandlot.runtime.base import (
    ContainerInfo,
    ContainerState,
    ImageRef,
    Progress,
    RegistryAuth,
    Runtime,
    SandboxSpec,
)
from sandlot.server import codes, spec_parts
from sandlot.server.api.schemas import CreateSandboxRequest
from sandlot.server.bounds import CreateBounds, check_metadata_keys, check_port
from sandlot.server.endpoint_ports import PortRange, warn_if_ephemeral
from sandlot.server.endpoints import EndpointForwarder
from sandlot.server.execd_start import wait_for_execd
from sandlot.server.expiry import ExpiryScheduler
from sandlot.server.labels import check_metadata, is_reserved
from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.observers import Observers
from sandlot.server.pools import POOL_REF, PoolService
from sandlot.server.resource_requests import parse_requests
from sandlot.server.snapshots import SnapshotService
from sandlot.server.store import SandboxStore
from sandlot.server.tenancy import principal as tenancy
from sandlot.server.tenancy.quotas import check_quota
from sandlot.server.tokens import ExecdTokens
from sandlot.server.tracing import Tracing
from sandlot.server.volume_checks import check_volumes

if TYPE_CHECKING:
    from sandlot.server.templates import TemplateService

EXPIRY_RETRY = 30.0  # seconds before a failed expiry is tried again

log = logging.getLogger(__name__)
# States in which a container that stops or vanishes makes the sandbox Failed.
_WATCHED_STATES = frozenset({SandboxState.RUNNING, SandboxState.PAUSING, SandboxState.PAUSED,
                             SandboxState.RESUMING})

KEEP_ALIVE = ["tail", "-f", "/dev/null"]
# The keep-alive idiom (the SDKs' default entrypoint) is recorded as asked but not started:
# execd, the sandbox's PID 1, keeps the sandbox alive by itself. One process and one spawn
# less per sandbox.
IDLE_ENTRYPOINTS = (KEEP_ALIVE, ["sleep", "infinity"])
# The port of the reference platform's egress sidecar: the SDKs look its endpoint up on every
# create (sandlot runs no sidecar; the endpoint forwards to that port in the sandbox).
SDK_EGRESS_PORT = 18080
# OSEP-0009 (deprecated spelling, still what 1.x clients send): renew the TTL on proxy access.
RENEW_ON_ACCESS_KEY = "access.renew.extend.seconds"
PAUSE_MODE_KEY = "sandlot.pause.mode"  # "freeze" | "hibernate" (gVisor): per-sandbox pause
_RENEW_ON_ACCESS_EVERY = 5.0  # seconds between persisted renewals of one sandbox
EXECD_READY_TIMEOUT = 60.0


@dataclass
class Page:
    items: list[SandboxRecord]
    page: int
    page_size: int
    total_items: int

    @property
    def total_pages(self) -> int:
        return (self.total_items + self.page_size - 1) // self.page_size

    @property
    def has_next_page(self) -> bool:
        return self.page < self.total_pages


class SandboxService:
    def __init__(
        self, cfg: Config, runtime: Runtime, store: SandboxStore, tokens: ExecdTokens
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.store = store
        self.tokens = tokens
        self.bounds = CreateBounds(cfg)
        self.expiry = ExpiryScheduler(self._expire)
        self._provisioning: dict[str, asyncio.Task[None]] = {}
        endpoint_ports = PortRange.parse(cfg.server.endpoint_ports)
        warn_if_ephemeral(endpoint_ports)
        self.forwarder = EndpointForwarder(
            _bind_host(cfg.server.host), self.connect,
            idle_timeout=cfg.server.endpoint_idle_timeout_seconds,
            max_connections=cfg.server.max_connections_per_sandbox,
            start_of=self._provisioning.get,
            port_range=endpoint_ports,
            hand_off=self.hand_off,
        )
        self._records: dict[str, SandboxRecord] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Called with a sandbox id once it is gone (e.g. to drop pooled proxy clients).
        self.terminate_hooks: list[Callable[[str], Awaitable[None]]] = []
        self._last_access_renewal: dict[str, float] = {}
        self.snapshots: SnapshotService | None = None  # set by the app
        self.pools: PoolService | None = None  # set by the app
        self.templates: TemplateService | None = None  # set by the app
        # Creates still waiting to answer, and why one of them failed meanwhile.
        self._answer_pending: set[str] = set()
        self._create_errors: dict[str, SandlotError] = {}
        # Diagnostics and metrics follow the lifecycle through these (observers.py).
        self.observers = Observers()
        self.tracing = Tracing(TracingConfig())  # create spans: off until the app sets its own

    # ----- start-up and shutdown -------------------------------------------------------

    async def start(self) -> None:
        """Load the store and reconcile it with the runtime (see ``reconcile.py``)."""
        from sandlot.server.reconcile import reconcile

        for rec in await self.store.load_all():
            self._records[rec.id] = rec
        await reconcile(self)
        await self._reapply_network_policies()
        self.runtime.watch(self.container_changed)
        await self._prewarm()

    async def _reapply_network_policies(self) -> None:
        """Enforce the stored policies again (the store is the policy's source of truth)."""
        for rec in list(self._records.values()):
            if rec.network_policy is None or rec.state not in (
                    SandboxState.RUNNING, SandboxState.PAUSED):
                continue
            try:
                await self._runtime_set_policy(rec.id, parse_policy(rec.network_policy))
            except Exception:  # noqa: BLE001 - one sandbox must not stop the start
                log.exception("re-applying the network policy of %s failed", rec.id)

    async def _runtime_set_policy(self, sandbox_id: str, policy: EgressPolicy) -> None:
        setter = getattr(self.runtime, "set_network_policy", None)
        if setter is None:
            raise Unsupported(f"the {self.runtime.name} runtime cannot enforce a network policy")
        await setter(sandbox_id, policy)

    async def _prewarm(self) -> None:
        """Ask the runtime to keep warm sandboxes of the pooled images (if it can)."""
        if self.cfg.runtime.warm_pool_size <= 0:
            return
        for name in self.cfg.runtime.warm_pool_images:
            await self.runtime.prewarm(ImageRef(name))

    async def stop(self) -> None:
        """Stop serving; sandboxes keep running and are picked up by the next start."""
        await self.expiry.close()
        tasks = list(self._provisioning.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.forwarder.close()

    # ----- queries ---------------------------------------------------------------------

    def get(self, sandbox_id: str) -> SandboxRecord:
        rec = self._records.get(sandbox_id)
        # Another tenant's sandbox is answered exactly as an unknown one: existence must not leak.
        if rec is None or rec.state == SandboxState.TERMINATED or not tenancy.visible(rec.owner):
            raise _not_found(sandbox_id)
        return rec

    def record(self, sandbox_id: str) -> SandboxRecord | None:
        """The live record, whatever its state (None when unknown)."""
        return self._records.get(sandbox_id)

    def records(self) -> list[SandboxRecord]:
        return list(self._records.values())

    def pool_allocated(self, pool_name: str) -> int:
        """Live sandboxes created naming pool ``pool_name``."""
        return sum(1 for r in self._records.values()
                   if r.extensions.get(POOL_REF) == pool_name
                   and r.state not in (SandboxState.TERMINATED, SandboxState.FAILED))

    def list(
        self,
        states: list[str] | None,
        metadata: dict[str, str] | None,
        page: int,
        page_size: int,
    ) -> Page:
        wanted = {s.lower() for s in states} if states else None
        matches = [
            rec
            for rec in self._records.values()
            if rec.state != SandboxState.TERMINATED
            and tenancy.visible(rec.owner)
            and (wanted is None or rec.state.value.lower() in wanted)
            and all(rec.metadata.get(k) == v for k, v in (metadata or {}).items())
        ]
        matches.sort(key=lambda r: (r.created_at, r.id), reverse=True)  # newest first
        start = (page - 1) * page_size
        return Page(matches[start : start + page_size], page, page_size, len(matches))

    # ----- create ----------------------------------------------------------------------

    async def create(self, req: CreateSandboxRequest) -> SandboxRecord:
        with self.tracing.tracer.start_as_current_span("sandbox.create") as span:
            rec = await self._create(req)
            span.set_attribute("sandlot.sandbox_id", rec.id)
            span.set_attribute("sandlot.state", rec.state.value)
            return rec

    async def _create(self, req: CreateSandboxRequest) -> SandboxRecord:
        self._check_create(req)
        if req.network_policy is not None:
            # 400 naming the invalid rule, or saying why the backend cannot enforce it
            self._check_enforceable(parse_policy(req.network_policy))
        check_metadata_keys(req.metadata)
        self.bounds.check_timeout(req.timeout)
        self.bounds.check_capacity(self._live_count())
        limits = dict(req.resource_limits)
        pool_name = req.extensions.get(POOL_REF) or None
        pool_image = None
        pool_sourced = False  # the pool starts from a snapshot or template of its own
        if pool_name is not None:
            if self.pools is None or not self.runtime.capabilities.pools:
                # The reference's single-host (Docker) server answers this way too.
                raise InvalidRequest(f"extensions.poolRef: pools are not supported by the "
                                     f"{self.runtime.name} runtime",
                                     code=codes.UNSUPPORTED_POOL_REF)
            pool = self.pools.get(pool_name)  # 404 when unknown
            pool_image = pool.image
            pool_source = pool_image.partition(":")[0]
            if pool_source in ("snapshot", "template") and ":" in pool_image:
                if req.image is not None or req.snapshot_id or req.template_id:
                    raise InvalidRequest(f"pool {pool_name} starts from {pool_image}: give "
                                         "no image, snapshotId or templateId with it")
                ref = pool_image.partition(":")[2]
                pool_sourced = True
                if pool_source == "snapshot":
                    req = req.model_copy(update={"snapshot_id": ref})
                else:
                    req = req.model_copy(update={"template_id": ref})
                pool_image = None
            elif req.image is not None and req.image.uri != pool_image:
                raise InvalidRequest(f"image {req.image.uri} differs from pool {pool_name}'s "
                                     f"image {pool_image}: leave image out or give the same")
            limits.update(pool.resource_limits)  # the pool's shape, whatever the request says
        # A pool's own snapshot or template is the administrator's choice, open to every
        # tenant claiming from the pool; one a request names is looked up as its tenant.
        with tenancy.acting_as(tenancy.SYSTEM) if pool_sourced else contextlib.nullcontext():
            snapshot_id, image_uri, limits, env = self._source(req, pool_image, limits)
        resources = self.bounds.resources(limits)
        limits = {**self.bounds.defaults, **limits}  # what the sandbox gets
        disk = self._disk_bytes(limits)
        requests = parse_requests(
            req.resource_requests, supported=self.runtime.capabilities.resource_requests,
            runtime=self.runtime.name, cpu_limit=resources.cpu, memory_limit=resources.memory)
        volumes = spec_parts.volume_specs(req.volumes)
        await self.runtime.check_volumes(volumes)
        # Checked with no await before the record is added: concurrent creates of one tenant
        # cannot both pass on the same room.
        check_quota(tenancy.current(), self._records.values(), resources.cpu, resources.memory)
        now = utcnow()
        rec = SandboxRecord(
            id=str(uuid.uuid4()),
            state=SandboxState.PENDING,
            reason=codes.STARTING,
            message=codes.STARTING_MESSAGE,
            image_uri=image_uri,
            entrypoint=list(req.entrypoint or KEEP_ALIVE),
            execd_token=None,  # derived from the server secret: see execd_token()
            created_at=now,
            last_transition_at=now,
            updated_at=now,
            expires_at=now + timedelta(seconds=req.timeout) if req.timeout else None,
            metadata=dict(req.metadata),
            resource_limits=limits,
            extensions=dict(req.extensions),
            platform=req.platform.model_dump() if req.platform else None,
            network_policy=req.network_policy,
            owner=tenancy.owner_of_new(),
        )
        auth = (
            RegistryAuth(req.image.auth.username, req.image.auth.password)
            if req.image is not None and req.image.auth
            else None
        )
        self._records[rec.id] = rec
        self.observers.transitioned(rec, SandboxState.PENDING)
        self.expiry.schedule(rec.id, rec.expires_at)
        if pool_name is not None and self.pools is not None:
            try:
                await self.pools.refill(pool_name)  # poolMax counts this sandbox now
            except Exception:  # noqa: BLE001 - the pool is an optimisation; the create goes on
                log.warning("re-sizing pool %s failed", pool_name, exc_info=True)
        wait = self.cfg.server.create_wait_seconds
        if wait <= 0:  # answered at once, as Pending: stored before the answer names it
            await self.store.save(rec)
        parts = {"env": env, "cpu": resources.cpu, "memory": resources.memory,
                 "pids": resources.pids, "disk": disk, "auth": auth,
                 "volumes": volumes, "snapshot_id": snapshot_id, "requests": requests}
        task = asyncio.create_task(self._provision(rec, parts))
        self._provisioning[rec.id] = task
        task.add_done_callback(self._provisioned)
        # Answer with Running when the sandbox comes up quickly (cached image, warm pool), so
        # clients need no polling round; slow starts (pulls) still answer Pending in time.
        if wait > 0:
            self._answer_pending.add(rec.id)
            try:
                await asyncio.wait({task}, timeout=wait)
            finally:
                self._answer_pending.discard(rec.id)
            if not task.done():
                # Stored before the answer names the sandbox. A create that finished within
                # the wait stored its outcome itself: one write instead of two. (A crash
                # before any write leaves a container without a record, which restart
                # reconciliation deletes.)
                await self.store.save(rec)
            elif rec.id in self._create_errors:
                # Failed within the wait: answer with the error and keep no sandbox, as the
                # reference does (its create is synchronous and leaves nothing behind).
                error = self._create_errors.pop(rec.id)
                await self._forget(rec)
                raise error
        return rec

    def _source(self, req: CreateSandboxRequest, pool_image: str | None,
                limits: dict[str, str]) -> tuple[str | None, str, dict[str, str], dict[str, str]]:
        """What a sandbox starts from: (snapshot id, image, limits, env)."""
        snapshot_id = req.snapshot_id
        env = dict(req.env)
        if req.template_id is not None:
            if self.templates is None:
                raise Unsupported("templates are not supported by this server")
            snapshot_id, template = self.templates.snapshot_for(req.template_id)
            limits = {**template["resourceLimits"], **limits}
            env = {**template["env"], **env}
            image_uri = self.snapshots.ready(snapshot_id).image_uri if self.snapshots else ""
        elif snapshot_id is not None:
            if self.snapshots is None:
                raise Unsupported("snapshots are not supported by this server")
            image_uri = self.snapshots.ready(snapshot_id).image_uri
        elif pool_image is not None:
            image_uri = pool_image
        else:
            assert req.image is not None
            image_uri = req.image.uri
        return snapshot_id, image_uri, limits, env

    def _disk_bytes(self, limits: dict[str, str]) -> int | None:
        """The writable layer's cap: the request's ``ephemeral-storage`` or the default."""
        disk = self.bounds.disk(limits)  # 400 beyond the maximum
        if disk is None:
            return None
        if not self.runtime.capabilities.disk_limit:
            raise Unsupported(f"ephemeral-storage limits are not supported by the "
                              f"{self.runtime.name} runtime: it cannot cap a sandbox's disk use")
        return disk

    async def _forget(self, rec: SandboxRecord) -> None:
        self.expiry.cancel(rec.id)
        self._records.pop(rec.id, None)
        self._locks.pop(rec.id, None)
        await self.store.delete(rec.id)

    def _live_count(self) -> int:
        """Sandboxes that hold (or will hold) a container: the ones max_sandboxes counts."""
        gone = (SandboxState.TERMINATED, SandboxState.FAILED)
        return sum(1 for rec in self._records.values() if rec.state not in gone)

    def _provisioned(self, task: asyncio.Task[None]) -> None:
        for sid, t in list(self._provisioning.items()):
            if t is task:
                del self._provisioning[sid]

    def _check_create(self, req: CreateSandboxRequest) -> None:
        """Refuse what cannot be honoured, in the reference server's order and with its codes."""
        _check_renew_on_access(req.extensions)
        if req.snapshot_id is not None and req.image is not None:
            raise InvalidRequest("give either image or snapshotId, not both")
        if req.template_id is not None and (req.image is not None or req.snapshot_id is not None):
            raise InvalidRequest("give one of image, snapshotId and templateId")
        pooled = bool(req.extensions.get(POOL_REF))
        if pooled and req.snapshot_id is not None:
            raise InvalidRequest("give either extensions.poolRef or snapshotId, not both")
        if req.image is None and req.snapshot_id is None and req.template_id is None \
                and not pooled:
            raise InvalidRequest("image.uri (or snapshotId, or extensions.poolRef) is required")
        check_metadata(req.metadata)
        if req.platform is not None:
            _check_platform(req, self.runtime.capabilities.platforms, self.runtime.name)
        if req.timeout is not None:
            _check_timeout(req.timeout, self.cfg.server.max_sandbox_timeout_seconds)
        if req.secure_access:
            raise InvalidRequest(
                "secureAccess is not supported by this server: it has no ingress gateway to "
                "issue access credentials for.",
                code=codes.INVALID_PARAMETER,
            )
        caps = self.runtime.capabilities
        check_volumes(req.volumes, self.cfg.storage.allowed_host_paths, caps.volume_kinds,
                      self.runtime.name, str(self.cfg.data_dir), caps.pvc_size)
        if req.network_policy is not None and not caps.network_policy:
            raise InvalidRequest(
                f"networkPolicy is not supported by the {self.runtime.name} runtime: it "
                "cannot restrict egress, and a policy it cannot enforce is refused",
                code=codes.INVALID_PARAMETER,
            )
        if req.credential_proxy and req.credential_proxy.get("enabled"):
            raise _unsupported("the credential proxy is not supported by this server")
        if req.lifecycle and (req.lifecycle.get("preStart") or req.lifecycle.get("periodic")):
            raise _unsupported("lifecycle hooks (preStart, periodic) are not supported yet")
        pause_mode = req.extensions.get(PAUSE_MODE_KEY)
        if pause_mode is not None and pause_mode not in ("freeze", "hibernate"):
            raise InvalidRequest(
                f"extensions[{PAUSE_MODE_KEY!r}] must be \"freeze\" or \"hibernate\", "
                f"got {pause_mode!r}"
            )
        if pause_mode == "hibernate" and not self.runtime.capabilities.hibernate:
            raise Unsupported(
                f'extensions[{PAUSE_MODE_KEY!r}] = "hibernate" needs the gVisor runtime '
                '([secure_runtime] type = "gvisor"); this server can only freeze'
            )
        gpu = req.resource_limits.get("gpu")
        if gpu not in (None, "", "0") and not caps.gpu:
            raise _unsupported(
                f"GPU resources are not supported by the {self.runtime.name} runtime"
            )

    async def _provision(self, rec: SandboxRecord, parts: dict[str, Any]) -> None:
        async def progress(step: str, detail: str) -> None:
            # The runtime names its step; clients see the reference's Pending reason, with
            # the step in the message.
            self.observers.step(rec, step, detail)
            if step == "Starting":
                # In memory only: a crash now leaves the stored Pending record, which restart
                # reconciliation resolves either way; one store write less per create.
                rec.transition(SandboxState.PENDING, codes.STARTING, codes.STARTING_MESSAGE)
            elif step == "Pulling":
                message = f"Pulling image {rec.image_uri}."
                await self.set_state(rec, SandboxState.PENDING, codes.STARTING, message)
            else:
                await self.set_state(rec, SandboxState.PENDING, codes.STARTING, detail)

        with self.tracing.tracer.start_as_current_span(
                "sandbox.provision", attributes={"sandlot.sandbox_id": rec.id,
                                                 "sandlot.image": rec.image_uri}):
            await self._provision_traced(rec, parts, progress)

    async def _provision_traced(self, rec: SandboxRecord, parts: dict[str, Any],
                                progress: Progress) -> None:
        token = self.execd_token(rec)
        tracer = self.tracing.tracer
        try:
            platform = rec.platform
            spec = SandboxSpec(
                sandbox_id=rec.id,
                image=ImageRef(
                    rec.image_uri, parts["auth"],
                    f"{platform['os']}/{platform['arch']}" if platform else None,
                ),
                entrypoint=[] if rec.entrypoint in IDLE_ENTRYPOINTS else rec.entrypoint,
                env=parts["env"],
                cpu_cores=parts["cpu"],
                memory_bytes=parts["memory"],
                disk_bytes=parts["disk"],
                cpu_request_cores=parts["requests"].cpu if parts["requests"] else None,
                memory_request_bytes=parts["requests"].memory if parts["requests"] else None,
                pids_limit=parts["pids"],
                execd_token=token,
                volumes=parts["volumes"],
                network_policy=spec_parts.network_policy(rec.network_policy),
                extensions=dict(rec.extensions),
                metadata=dict(rec.metadata),
                snapshot_id=parts["snapshot_id"],
            )
            with tracer.start_as_current_span("runtime.create",
                                              attributes={"sandlot.runtime": self.runtime.name}):
                created = await self.runtime.create(spec, progress)
            if not created.execd_ready:
                port = self.cfg.execd.port
                with tracer.start_as_current_span("execd.wait_ready"):
                    await wait_for_execd(self.runtime, rec.id, port, token, EXECD_READY_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, SandlotError | TimeoutError):
                log.exception("provisioning %s failed", rec.id)
            await self._fail_provisioning(rec, _provisioning_error(rec.image_uri, exc))
            return
        if rec.state == SandboxState.PENDING:
            # Running is shown only once it is stored: a client that saw it must find it again
            # after a crash of the server. The SDKs ask for these endpoints right after every
            # create: open them now, beside the state's write (the store commits writes that
            # queue up together), so those requests find them open and stored.
            running = dataclasses.replace(rec)
            running.transition(SandboxState.RUNNING, codes.RUNNING, codes.RUNNING_MESSAGE)
            # Observers now: their event write joins the state's in one commit.
            self.observers.transitioned(running, rec.state)
            with tracer.start_as_current_span("store.save_running"):
                await asyncio.gather(
                    self.store.save(running),
                    *(self.open_endpoint(rec.id, port)
                      for port in (self.cfg.execd.port, SDK_EGRESS_PORT)),
                )
            if rec.state == SandboxState.PENDING:  # else a delete came meanwhile: it wins
                self._publish(rec, running)

    async def _fail_provisioning(self, rec: SandboxRecord, error: SandlotError) -> None:
        # Leave nothing behind: the record stays (Failed, with why), the container goes.
        await self.observers.before_delete(rec)
        with contextlib.suppress(Exception):
            await self.runtime.delete(rec.id)
        if rec.state == SandboxState.PENDING:
            if rec.id in self._answer_pending:
                self._create_errors[rec.id] = error
            await self.set_state(
                rec, SandboxState.FAILED, codes.PROVISIONING_ERROR, error.message
            )

    # ----- state changes ---------------------------------------------------------------

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def set_state(
        self, rec: SandboxRecord, state: SandboxState, reason: str | None, message: str | None
    ) -> None:
        """Move ``rec`` to ``state`` and store it (also used by restart reconciliation)."""
        self._transition(rec, state, reason, message)
        await self.store.save(rec)

    def _transition(
        self, rec: SandboxRecord, state: SandboxState, reason: str | None, message: str | None
    ) -> None:
        before = rec.state
        rec.transition(state, reason, message)
        if before != state:
            self.observers.transitioned(rec, before)

    @staticmethod
    def _publish(rec: SandboxRecord, stored: SandboxRecord) -> None:
        """Show the state change already written (and observed) as ``stored``, a changed
        copy of ``rec``."""
        rec.state, rec.reason, rec.message = stored.state, stored.reason, stored.message
        rec.last_transition_at, rec.updated_at = stored.last_transition_at, stored.updated_at

    async def container_changed(self, sandbox_id: str, info: ContainerInfo) -> None:
        """The runtime saw a live sandbox's container stop or vanish: it is Failed now."""
        rec = self._records.get(sandbox_id)
        if rec is None or rec.state not in _WATCHED_STATES or info.state in (
                ContainerState.RUNNING, ContainerState.PAUSED, ContainerState.CREATED):
            return
        async with self._lock(sandbox_id):
            if rec.state not in _WATCHED_STATES:
                return  # deleted or changed meanwhile
            await self.forwarder.close_sandbox(sandbox_id)
            self.observers.container_ended(rec, info)
            if info.state == ContainerState.MISSING:
                await self.set_state(rec, SandboxState.FAILED, codes.EXITED_ERROR,
                                     codes.with_reason("Sandbox container no longer exists in the "
                                                 "runtime.", info))
                return
            await self.observers.before_delete(rec)
            with contextlib.suppress(Exception):
                await self.runtime.delete(sandbox_id)
            # The reference's reason and messages, as restart reconciliation writes them.
            await self.set_state(
                rec, SandboxState.FAILED, codes.EXITED_ERROR, codes.with_reason(
                    f"Sandbox container exited with code {info.exit_code}."
                    if info.exit_code is not None else "Sandbox container is no longer running.",
                    info))

    async def delete(self, sandbox_id: str, reason: str = "user_delete") -> None:
        rec = self.get(sandbox_id)
        task = self._provisioning.get(sandbox_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        async with self._lock(sandbox_id):
            if rec.state in (SandboxState.STOPPING, SandboxState.TERMINATED):
                # A concurrent delete got there first: the sandbox is gone, as on the reference.
                raise _not_found(sandbox_id)
            await self.set_state(
                rec, SandboxState.STOPPING, codes.STOPPING, "Sandbox is being deleted."
            )
            await self.terminate(rec, reason)

    async def terminate(self, rec: SandboxRecord, reason: str) -> None:
        """Delete the container, then the record; a failed delete leaves it Failed."""
        self.expiry.cancel(rec.id)
        await self.forwarder.close_sandbox(rec.id)
        await self.observers.before_delete(rec)
        try:
            await self.runtime.delete(rec.id)
        except Exception as exc:
            log.exception("deleting %s failed", rec.id)
            message = f"Failed to delete sandbox container: {exc}"
            await self.set_state(rec, SandboxState.FAILED, codes.EXITED_ERROR, message)
            raise RuntimeFailure(message, code=codes.SANDBOX_DELETE_FAILED) from exc
        self._transition(rec, SandboxState.TERMINATED, reason, "sandbox terminated")
        await self.store.delete(rec.id)
        self._records.pop(rec.id, None)
        self._locks.pop(rec.id, None)
        self._last_access_renewal.pop(rec.id, None)
        for hook in self.terminate_hooks:
            with contextlib.suppress(Exception):
                await hook(rec.id)
        pool_name = rec.extensions.get(POOL_REF)
        if pool_name and self.pools is not None:
            with contextlib.suppress(Exception):
                await self.pools.refill(pool_name)  # room under poolMax again

    async def _expire(self, sandbox_id: str) -> None:
        rec = self._records.get(sandbox_id)
        if rec is None or rec.expires_at is None:
            return
        if rec.expires_at > utcnow():  # renewed meanwhile, or the timer ran a hair early
            self.expiry.schedule(sandbox_id, rec.expires_at)
            return
        self.observers.expiring(rec)
        try:
            with tenancy.acting_as(tenancy.SYSTEM):  # whoever's request armed the timer
                await self.delete(sandbox_id, reason="ttl_expiry")
        except (NotFound, Conflict):
            pass
        except Exception:
            # Never drop an expiry: try again shortly (the record says why it failed).
            log.exception("expiring %s failed; retrying in %.0fs", sandbox_id, EXPIRY_RETRY)
            self.expiry.schedule(sandbox_id, utcnow() + timedelta(seconds=EXPIRY_RETRY))

    def _no_pause(self, what: str) -> InvalidRequest:
        """A 400 for pause/resume on a backend that cannot pause; on Kubernetes with the
        reference's code and words for its providers without pause."""
        if self.runtime.name == "kubernetes":
            return InvalidRequest(
                f"{what} is not supported for this sandbox type: the kubernetes runtime "
                "runs plain Pods, and Kubernetes cannot freeze a Pod's processes and keep "
                "its memory", code=codes.K8S_INVALID_STATE)
        return _unsupported(f"{what.lower()[:-1]}ing is not supported by the "
                            f"{self.runtime.name} runtime")

    async def pause(self, sandbox_id: str) -> None:
        rec = self.get(sandbox_id)
        if not self.runtime.capabilities.pause:
            raise self._no_pause("Pause")
        async with self._lock(sandbox_id):
            if rec.state != SandboxState.RUNNING:
                raise Conflict(
                    f"Sandbox is not in a running state (it is {rec.state.value}).",
                    code=codes.SANDBOX_NOT_RUNNING,
                )
            await self.set_state(
                rec, SandboxState.PAUSING, codes.PAUSING, "Sandbox is being paused."
            )
            try:
                await self.runtime.pause(sandbox_id)
            except Exception as exc:
                await self.set_state(
                    rec, SandboxState.RUNNING, codes.RUNNING, codes.RUNNING_MESSAGE
                )
                raise RuntimeFailure(
                    f"Failed to pause sandbox container: {exc}", code=codes.SANDBOX_PAUSE_FAILED
                ) from exc
            try:  # only to name the pause; the sandbox is paused either way
                hibernated = (await self.runtime.inspect(sandbox_id)).reason == "hibernated"
            except Exception:  # noqa: BLE001 - never leave the record Pausing
                log.warning("could not inspect %s after pausing it", sandbox_id, exc_info=True)
                hibernated = False
            if hibernated:  # sandlot's own pause mode: its own reason
                await self.set_state(rec, SandboxState.PAUSED, "Hibernated",
                                     "processes and memory checkpointed to disk; resume "
                                     "restores them")
            else:
                await self.set_state(rec, SandboxState.PAUSED, codes.PAUSED, codes.PAUSED_MESSAGE)

    async def resume(self, sandbox_id: str) -> None:
        rec = self.get(sandbox_id)
        if not self.runtime.capabilities.pause:
            raise self._no_pause("Resume")
        async with self._lock(sandbox_id):
            if rec.state != SandboxState.PAUSED:
                raise Conflict(
                    f"Sandbox is not in a paused state (it is {rec.state.value}).",
                    code=codes.SANDBOX_NOT_PAUSED,
                )
            await self.set_state(
                rec, SandboxState.RESUMING, codes.RESUMING, "Sandbox is being resumed."
            )
            try:
                await self.runtime.resume(sandbox_id)
            except Exception as exc:
                await self.set_state(rec, SandboxState.PAUSED, codes.PAUSED, codes.PAUSED_MESSAGE)
                raise RuntimeFailure(
                    f"Failed to resume sandbox container: {exc}", code=codes.SANDBOX_RESUME_FAILED
                ) from exc
            await self.set_state(
                rec, SandboxState.RUNNING, codes.RUNNING, codes.RUNNING_MESSAGE
            )

    async def renew(self, sandbox_id: str, expires_at: datetime) -> SandboxRecord:
        """Set a new absolute expiry; may shorten as well as extend (as on the reference)."""
        rec = self.get(sandbox_id)
        # A time without a zone is read as UTC, and the answer is in UTC, as on the reference.
        expires_at = (
            expires_at.replace(tzinfo=UTC)
            if expires_at.tzinfo is None
            else expires_at.astimezone(UTC)
        )
        if expires_at <= utcnow():
            raise InvalidRequest(
                "New expiration time must be in the future.", code=codes.INVALID_EXPIRATION
            )
        if rec.expires_at is None:
            raise Conflict(
                f"Sandbox {sandbox_id} does not have automatic expiration enabled (it was "
                "created without a timeout), so there is nothing to renew.",
                code=codes.INVALID_EXPIRATION,
            )
        async with self._lock(sandbox_id):
            if rec.state == SandboxState.TERMINATED:
                raise _not_found(sandbox_id)
            rec.expires_at = expires_at
            rec.updated_at = utcnow()
            await self.store.save(rec)
            self.expiry.schedule(sandbox_id, expires_at)
        return rec

    async def renew_on_access(self, sandbox_id: str) -> None:
        """Push ``expiresAt`` out on proxied access when the sandbox opted in at create."""
        rec = self._records.get(sandbox_id)
        if rec is None or rec.expires_at is None:
            return
        seconds = rec.extensions.get(RENEW_ON_ACCESS_KEY)
        if seconds is None:
            return
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._last_access_renewal.get(sandbox_id, -1e9) < _RENEW_ON_ACCESS_EVERY:
            return
        new_expiry = utcnow() + timedelta(seconds=int(seconds))
        if new_expiry <= rec.expires_at:
            return
        self._last_access_renewal[sandbox_id] = loop_now
        async with self._lock(sandbox_id):
            if rec.state in (SandboxState.STOPPING, SandboxState.TERMINATED):
                return
            rec.expires_at = new_expiry
            rec.updated_at = utcnow()
            await self.store.save(rec)
            self.expiry.schedule(sandbox_id, new_expiry)

    async def patch_metadata(self, sandbox_id: str, patch: dict[str, Any]) -> SandboxRecord:
        """JSON merge patch (RFC 7396): a value sets, null deletes, an absent key stays."""
        rec = self.get(sandbox_id)
        for key in patch:
            if is_reserved(key):
                raise InvalidRequest(
                    f"Metadata key '{key}' is reserved (opensandbox.io/ prefix).",
                    code=codes.RESERVED_METADATA_KEY,
                )
        check_metadata({k: v for k, v in patch.items() if v is not None})
        async with self._lock(sandbox_id):
            merged = dict(rec.metadata)
            for key, value in patch.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            rec.metadata = merged
            rec.updated_at = utcnow()
            await self.store.save(rec)
        return rec

    # ----- endpoints -------------------------------------------------------------------

    async def endpoint(
        self, sandbox_id: str, port: int, use_server_proxy: bool, server_authority: str
    ) -> dict[str, Any]:
        """``{endpoint, headers?}``: ``host:port`` direct, or the server's unversioned proxy
        path (``host/sandboxes/{id}/proxy/{port}``), as the reference spells both."""
        rec = self.get(sandbox_id)
        if rec.state in (SandboxState.STOPPING, SandboxState.FAILED):
            raise Conflict(
                f"Sandbox is not in a running state (it is {rec.state.value}"
                f"{': ' + rec.message if rec.message else ''}).",
                code=codes.SANDBOX_NOT_RUNNING,
            )
        headers: dict[str, str] = {}
        if port == self.cfg.execd.port:
            headers[execd_client.TOKEN_HEADER] = self.execd_token(rec)
        elif port == SDK_EGRESS_PORT:
            headers[egress_api.EGRESS_AUTH_HEADER] = egress_token(self.execd_token(rec))
        elif port == JUPYTER_PORT:  # the Jupyter API of code-interpreter sandboxes
            headers.update(jupyter_endpoint_headers(self.execd_token(rec)))
        if use_server_proxy:
            url = f"{server_authority}/sandboxes/{sandbox_id}/proxy/{port}"
        else:
            host_port = await self.open_endpoint(sandbox_id, port)
            url = f"{self.cfg.server.endpoint_host}:{host_port}"
        body: dict[str, Any] = {"endpoint": url}
        if headers:  # omitted when empty, as the reference does
            body["headers"] = headers
        return body

    async def open_endpoint(
        self, sandbox_id: str, port: int, preferred: int | None = None
    ) -> int:
        known = self.forwarder.port_of(sandbox_id, port)
        if known is not None:
            return known
        check_port(port)
        self.bounds.check_listeners(self.forwarder.listener_count(sandbox_id))
        host_port = await self.forwarder.open(sandbox_id, port, preferred)
        if sandbox_id not in self._records:  # deleted meanwhile
            await self.forwarder.close_sandbox(sandbox_id)
            raise _not_found(sandbox_id)
        await self.store.save_endpoint(sandbox_id, port, host_port)
        return host_port

    def execd_token(self, rec: SandboxRecord) -> str:
        """The sandbox's execd token: derived, or the one stored by an older sandlot."""
        return rec.execd_token or self.tokens.token(rec.id)

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected socket to ``port`` in the sandbox (the runtime's, the only way in);
        the egress port is answered by sandlot itself, never by anything in the sandbox."""
        if port == SDK_EGRESS_PORT:
            self.get(sandbox_id)
            return await egress_api.open_socket(lambda: self._egress_access(sandbox_id))
        return await self.runtime.connect(sandbox_id, port)

    def hand_off(self, sandbox_id: str, port: int, conn: socket.socket) -> bool:
        """Give an endpoint's accepted connection to the sandbox whole, when its runtime
        takes that port so (``Runtime.hand_off``); the egress port is always sandlot's."""
        if port == SDK_EGRESS_PORT:
            return False
        return self.runtime.hand_off(sandbox_id, port, conn)

    # ----- network policy --------------------------------------------------------------

    def network_policy(self, sandbox_id: str) -> EgressPolicy:
        return parse_policy(self.get(sandbox_id).network_policy)

    async def set_network_policy(self, sandbox_id: str, policy: EgressPolicy) -> EgressPolicy:
        """Enforce ``policy`` at once, then store it (re-applied after a restart)."""
        rec = self.get(sandbox_id)
        async with self._lock(sandbox_id):
            if rec.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
                raise Conflict(
                    f"sandbox {sandbox_id} is {rec.state.value}; the network policy of a "
                    "Running or Paused sandbox can change",
                    code=codes.STATE_CONFLICT,
                )
            self._check_enforceable(policy)
            await self._runtime_set_policy(sandbox_id, policy)
            rec.network_policy = policy.to_json()
            rec.updated_at = utcnow()
            await self.store.save(rec)
            self.observers.policy_changed(rec)
        return policy

    def _check_enforceable(self, policy: EgressPolicy) -> None:
        try:
            self.runtime.check_network_policy(policy)
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message, code=codes.INVALID_PARAMETER) from exc

    def _egress_access(self, sandbox_id: str) -> egress_api.PolicyAccess | None:
        rec = self._records.get(sandbox_id)
        if rec is None:
            return None

        async def change(policy: EgressPolicy) -> None:
            await self.set_network_policy(sandbox_id, policy)

        return egress_api.PolicyAccess(
            token=egress_token(self.execd_token(rec)),
            current=lambda: self.network_policy(sandbox_id),
            change=change,
            enforcement_mode=self.cfg.egress.mode,
        )


def egress_token(execd_token: str) -> str:
    """The sandbox's OPENSANDBOX-EGRESS-AUTH value: derived from its stored secret, so it
    needs no column of its own and is the same after a restart."""
    return hmac.new(execd_token.encode(), b"sandlot egress api", hashlib.sha256).hexdigest()


def _bind_host(host: str) -> str:
    # Listeners follow the API's exposure: loopback API -> loopback endpoints.
    return host or "127.0.0.1"


def _not_found(sandbox_id: str) -> NotFound:
    return NotFound(f"Sandbox {sandbox_id} not found.", code=codes.SANDBOX_NOT_FOUND)


def _unsupported(message: str) -> InvalidRequest:
    # 400 with a code, as the reference refuses what its runtime cannot honour: the released
    # SDK parses the body of a 400 (and not of a 501) into ``SandboxApiException.error``.
    return InvalidRequest(message, code=codes.API_NOT_SUPPORTED)


def _check_renew_on_access(extensions: dict[str, str]) -> None:
    if RENEW_ON_ACCESS_KEY not in extensions:
        return
    raw = extensions[RENEW_ON_ACCESS_KEY].strip()
    if not raw.lstrip("+-").isdigit() or not 300 <= int(raw) <= 86400:
        raise InvalidRequest(
            f'Invalid extensions["{RENEW_ON_ACCESS_KEY}"]: a whole number of seconds from '
            f"300 to 86400 (5 minutes to 24 hours) is expected, got {raw!r}.",
            code=codes.INVALID_PARAMETER,
        )


def _check_platform(
    req: CreateSandboxRequest, offered: frozenset[str], runtime: str
) -> None:
    """The reference's os/arch vocabulary first (normalised), then what the runtime runs."""
    assert req.platform is not None
    os_name = req.platform.os.strip().lower()
    arch = req.platform.arch.strip().lower()
    if os_name not in ("linux", "windows"):
        raise InvalidRequest(
            f"Unsupported platform.os '{req.platform.os}'. Supported values: linux, windows.",
            code=codes.INVALID_PARAMETER,
        )
    if arch not in ("amd64", "arm64"):
        raise InvalidRequest(
            f"Unsupported platform.arch '{req.platform.arch}'. Supported values: amd64, arm64.",
            code=codes.INVALID_PARAMETER,
        )
    req.platform.os, req.platform.arch = os_name, arch
    wanted = f"{os_name}/{arch}"
    if offered and wanted not in offered:
        raise InvalidRequest(
            f"platform {wanted} cannot be satisfied: the {runtime} runtime runs "
            f"{', '.join(sorted(offered))}",
            code=codes.INVALID_PARAMETER,
        )


def _check_timeout(timeout: int, limit: int | None) -> None:
    try:
        utcnow() + timedelta(seconds=timeout)
    except (OverflowError, ValueError):
        raise InvalidRequest(
            f"Sandbox timeout {timeout}s is too large to represent.", code=codes.INVALID_PARAMETER
        ) from None
    if limit is not None and timeout > limit:
        raise InvalidRequest(
            f"Sandbox timeout {timeout}s exceeds the configured maximum of {limit}s "
            "(server.max_sandbox_timeout_seconds).",
            code=codes.INVALID_PARAMETER,
        )


def _provisioning_error(image_uri: str, exc: Exception) -> SandlotError:
    """What a failed create answers (and the Failed record says), in the reference's terms."""
    if isinstance(exc, ImageNotFound | ImagePullError):
        return RuntimeFailure(
            f"Failed to pull image {image_uri}: {exc.message}", code=codes.IMAGE_PULL_FAILED
        )
    if isinstance(exc, SandlotError) and exc.status < 500:
        return exc
    if isinstance(exc, SandlotError):
        detail = exc.message
    elif isinstance(exc, TimeoutError):
        detail = f"execd did not answer: {exc}"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    return RuntimeFailure(
        f"Failed to create or start container: {detail}", code=codes.SANDBOX_START_FAILED
    )
