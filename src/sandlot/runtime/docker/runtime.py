"""``DockerRuntime``: sandboxes as containers of a Docker engine (``[runtime] type = "docker"``).

For hosts that already run Docker and keep their images in it. Each sandbox is one
container named ``sandlot-<id>``, labelled with its sandbox id and with this sandlot's owner
id (one per data dir), so a restarted server finds its sandboxes again from the engine alone
and never touches containers of another sandlot or anyone else on the same engine. execd
comes from sandlot's bundle, bind-mounted read-only (``container.py``); the server reaches
it and every other port through ``connect`` (``network.py``).

The engine must run on this host (it mounts the bundle from this host's disk and the server
enters containers' network namespaces through their pids), as with a local dockerd.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import platform
import secrets
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

from docker.errors import APIError, DockerException
from docker.errors import NotFound as DockerNotFound

from sandlot import datadir
from sandlot.config import Config
from sandlot.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    RuntimeFailure,
    SandlotError,
    Unsupported,
)
from sandlot.images.model import Image
from sandlot.runtime import admission, bundle_prune, cgroupstats, execd_client, tcp_connect
from sandlot.runtime.admission import StartGate
from sandlot.runtime.base import (
    ContainerInfo,
    ContainerState,
    CreateResult,
    ImageRef,
    Progress,
    ResourceUsage,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
    StateListener,
    VolumeSpec,
    WarmPoolStats,
)
from sandlot.runtime.docker import images, snapshots, warm
from sandlot.runtime.docker.container import (
    LABEL_EXECD_PORT,
    LABEL_OWNER,
    NAME_PREFIX,
    Plan,
    bundles_named,
    container_name,
    sandbox_of,
    security_options,
)
from sandlot.runtime.docker.engine import Engine
from sandlot.runtime.docker.events import ContainerEvents
from sandlot.runtime.docker.network import HostPortAllocator, NetworkKind, NetworkMode
from sandlot.runtime.docker.volumes import DockerVolumes
from sandlot.runtime.execd_bundle import MOUNT_POINT, ensure_bundle
from sandlot.runtime.logtail import cut_to_line
from sandlot.runtime.oci import pool
from sandlot.runtime.oci.netns import NetnsConnector
from sandlot.runtime.oci.snapshot_pools import SnapshotPools

log = logging.getLogger(__name__)

_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
_STATES = {
    "created": ContainerState.CREATED,
    "running": ContainerState.RUNNING,
    "restarting": ContainerState.RUNNING,
    "paused": ContainerState.PAUSED,
    "removing": ContainerState.MISSING,  # on its way out of the engine
    "exited": ContainerState.STOPPED,
    "dead": ContainerState.STOPPED,
}



def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a reused pid from the container's init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class DockerRuntime(Runtime):
    """The Docker backend (see module docstring)."""

    name = "docker"

    def __init__(
        self, engine: Engine, plan: Plan, ports: HostPortAllocator, data_dir: Path,
        warm_pool_size: int = 0, warm_pool_images: list[str] | None = None,
        allowed_host_paths: list[str] | None = None, max_concurrent_starts: int = 0,
        snapshot_pool_size: int = 0, snapshot_pools_max: int = 4,
        snapshot_pool_idle_seconds: float = 600.0,
    ) -> None:
        self.engine = engine
        # Cold starts and warm refills queue here as on the OCI backend (admission.py): a
        # burst runs a few container starts (and execd start-ups) at a time.
        self.starts = StartGate(max_concurrent_starts)
        self.plan = plan
        self.ports = ports
        self.data_dir = data_dir
        # Warm starts run in the gate's background slots, taken by the pools (oci/pool.py).
        self.pool = pool.WarmPool(warm_pool_size, list(warm_pool_images or []),
                                  self._make_warm, self._remove, gate=self.starts)
        self._made_warm: set[str] = set()  # warm containers this instance started
        # Warm containers of the snapshots sandboxes are created from (snapshot_pools.py).
        self.snapshot_pools = SnapshotPools(snapshot_pool_size, snapshot_pools_max,
                                            snapshot_pool_idle_seconds, self._make_warm,
                                            self._remove, gate=self.starts)
        self._pool_lock_fd: int | None = None
        info_arch = _ARCHES.get(platform.machine(), platform.machine())
        self.capabilities = RuntimeCapabilities(
            pause=True, isolation=f"docker/{plan.engine_runtime or 'runc'}",
            platforms=frozenset({f"linux/{info_arch}"}), snapshots=True,
            volume_kinds=frozenset({"host", "pvc"}),
        )
        self.volumes = DockerVolumes(engine, plan.owner, data_dir / "docker-volumes", data_dir,
                                     list(allowed_host_paths or []))
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._connector = NetnsConnector()
        self._inits: dict[str, tuple[int, str]] = {}  # sandbox id -> (init pid, start time)
        self._events: ContainerEvents | None = None
        self._reports: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, cfg: Config) -> DockerRuntime:
        """Reach the engine, check ``[docker]``, build (or reuse) the execd bundle."""
        dcfg = cfg.docker
        network = NetworkMode.parse(dcfg.network_mode)
        ports = HostPortAllocator(dcfg.port_range_min, dcfg.port_range_max)
        security_opt = security_options(dcfg)
        engine = await asyncio.to_thread(Engine.from_env, dcfg.api_timeout)
        try:
            info = await engine.call(engine.client.info)
            engine_runtime = _engine_runtime(cfg, info)
            if network.kind == NetworkKind.USER:
                await _require_network(engine, network.name)
            if network.kind == NetworkKind.HOST:
                log.warning('[docker] network_mode = "host": sandboxes share the host network '
                            "(its ports, its addresses); use bridge or none to isolate them")
            datadir.create(cfg.data_dir)
            owner = datadir.owner_id(cfg.data_dir, "docker-owner")
            bundle = await asyncio.to_thread(
                ensure_bundle, cfg.data_dir / "execd-bundle",
                lambda: bundles_named(engine.api.containers(
                    all=True, filters={"label": [f"{LABEL_OWNER}={owner}"]}))
                | bundle_prune.named_in_oci_configs(cfg.data_dir, MOUNT_POINT))  # an OCI server's
            plan = Plan(bundle=bundle, cfg=dcfg, network=network, owner=owner,
                        execd_port=cfg.execd.port,
                        security_opt=security_opt, swap_limit=bool(info.get("SwapLimit")),
                        engine_runtime=engine_runtime)
            rt = cls(engine, plan, ports, cfg.data_dir, cfg.runtime.warm_pool_size,
                     cfg.runtime.warm_pool_images, cfg.storage.allowed_host_paths,
                     cfg.runtime.max_concurrent_starts, cfg.runtime.snapshot_pool_size,
                     cfg.runtime.snapshot_pools_max, cfg.runtime.snapshot_pool_idle_seconds)
            await rt._adopt_host_ports()
            if rt._own_pool():
                await rt._sweep_pool()  # leftovers of a crash: nobody else owns them
                await rt._sweep_volumes()
        except BaseException:
            engine.close()
            raise
        log.info("docker engine %s (%s), network mode %s", info.get("ServerVersion"),
                 info.get("Name"), network.name)
        return rt

    # -- create -------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, progress: Progress | None = None) -> CreateResult:
        _check_spec(spec)
        async with contextlib.AsyncExitStack() as slot:
            async with self._locks[spec.sandbox_id]:
                if await self._attrs(spec.sandbox_id) is not None:
                    raise Conflict(f"sandbox {spec.sandbox_id} already exists")
                image = await self._image_of(spec, progress)
                # A warm container's mounts are fixed: creates with volumes start cold.
                taken = await self._take_warm(spec, image) if not spec.volumes else None
                if taken is not None and await self._claim(spec, image, taken):
                    return CreateResult(execd_ready=True)  # its execd has just answered
                await slot.enter_async_context(self.starts.slot())
                await self._start(spec, image)
            # Still in the slot (execd's start-up is most of a start's CPU), no longer holding
            # the sandbox's lock: a delete need not wait for the start-up.
            return CreateResult(execd_ready=await self._wait_started(spec))

    async def _wait_started(self, spec: SandboxSpec) -> bool:
        return await admission.started(
            self._execd_connect(spec.sandbox_id), spec.execd_token,
            ended=admission.container_ended(self.inspect, spec.sandbox_id))

    async def _take_warm(self, spec: SandboxSpec,
                         image: images.EngineImage) -> pool.Warm | None:
        """A warm container of the snapshot's pool or of the server's pool for an image (one
        being started if none is ready: ``WarmPool.claim``)."""
        if spec.snapshot_id is not None:
            return await self.snapshot_pools.claim(
                spec.snapshot_id, _pool_key(snapshots.image_ref(spec.snapshot_id), image))
        return await self.pool.claim(_pool_key(spec.image.reference, image))

    async def _image_of(self, spec: SandboxSpec, progress: Progress | None) -> images.EngineImage:
        if spec.snapshot_id is None:
            return await images.resolve(self.engine, spec.image, progress)
        found = await images.lookup(self.engine, snapshots.image_ref(spec.snapshot_id))
        if found is None:
            raise NotFound(f"snapshot {spec.snapshot_id}'s image is gone from the Docker engine",
                           code="SNAPSHOT::NOT_FOUND")
        return found

    async def _start(self, spec: SandboxSpec, image: images.EngineImage,
                     pooled: bool = False) -> None:
        """Create and start ``spec``'s container; on any failure nothing of it is left."""
        host_port = self.ports.allocate() if self.plan.network.kind == NetworkKind.HOST \
            else None
        try:
            volume_mounts = (await self.volumes.mounts(spec.sandbox_id, spec.volumes)
                             if spec.volumes else [])
            kwargs = self.plan.create_kwargs(self.engine.api, spec, image, host_port, pooled,
                                             volume_mounts)
            created = await self.engine.call(self.engine.api.create_container, **kwargs)
            await self.engine.call(self.engine.api.start, created["Id"])
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self._remove(spec.sandbox_id)
            self.ports.release(host_port)
            if isinstance(exc, SandlotError):
                raise
            if isinstance(exc, DockerException):
                raise RuntimeFailure(
                    f"the Docker engine cannot start sandbox {spec.sandbox_id}: "
                    f"{_explain(exc)}"
                ) from exc
            raise

    # -- delete -------------------------------------------------------------------------

    async def delete(self, sandbox_id: str) -> None:
        _check_id(sandbox_id)
        async with self._locks[sandbox_id]:
            await self._remove(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def _remove(self, sandbox_id: str) -> None:
        attrs = await self._attrs(sandbox_id)
        self._inits.pop(sandbox_id, None)
        if attrs is not None:
            await self._remove_container(sandbox_id, attrs)
        # Only once its container is gone: staged binds and claims (no-op without volumes).
        try:
            await self.volumes.release(sandbox_id)
        except OSError as exc:
            raise RuntimeFailure(f"cannot release sandbox {sandbox_id}'s volumes: {exc}") \
                from exc

    async def _remove_container(self, sandbox_id: str, attrs: dict[str, Any]) -> None:
        try:
            await self.engine.call(self.engine.api.remove_container, attrs["Id"], v=True,
                                   force=True)
        except DockerNotFound:
            pass
        except APIError as exc:
            if "already in progress" not in _explain(exc):
                raise RuntimeFailure(f"cannot remove sandbox {sandbox_id}: {_explain(exc)}") \
                    from exc
            await self._wait_gone(attrs["Id"])
        self.ports.release(_host_port(attrs))

    async def _wait_gone(self, container: str, timeout: float = 30) -> None:
        """Another removal of the same container is under way: wait until it is done."""
        with contextlib.suppress(DockerNotFound):
            async with asyncio.timeout(timeout):
                while True:
                    await self.engine.call(self.engine.api.inspect_container, container)
                    await asyncio.sleep(0.1)

    # -- state --------------------------------------------------------------------------

    async def _attrs(self, sandbox_id: str) -> dict[str, Any] | None:
        """The engine's view of this sandlot's container for ``sandbox_id``; None if none."""
        try:
            attrs: dict[str, Any] = await self.engine.call(
                self.engine.api.inspect_container, container_name(sandbox_id))
        except DockerNotFound:
            return None
        except DockerException as exc:
            raise RuntimeFailure(f"the Docker engine cannot inspect {sandbox_id}: "
                                 f"{_explain(exc)}") from exc
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_OWNER) != self.plan.owner:
            return None  # same name, but not this sandlot's container
        return attrs

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        _check_id(sandbox_id)
        return await self._inspect(sandbox_id)

    async def _inspect(self, sandbox_id: str) -> ContainerInfo:
        attrs = await self._attrs(sandbox_id)
        if attrs is None:
            return ContainerInfo(sandbox_id, ContainerState.MISSING,
                                 reason="the container is gone from the Docker engine")
        st = attrs.get("State") or {}
        state = _STATES.get(str(st.get("Status", "")), ContainerState.STOPPED)
        if state == ContainerState.MISSING:
            return ContainerInfo(sandbox_id, state,
                                 reason="the container is being removed from the Docker engine")
        if state == ContainerState.STOPPED:
            return ContainerInfo(sandbox_id, state, exit_code=st.get("ExitCode"),
                                 reason="OOMKilled" if st.get("OOMKilled") else None)
        return ContainerInfo(sandbox_id, state, pid=int(st.get("Pid") or 0) or None)

    async def pause(self, sandbox_id: str) -> None:
        # Under the sandbox's lock, as a snapshot's commit is: the engine pauses the container
        # for the commit and unpauses it after, which would undo a pause made meanwhile.
        async with self._locks[sandbox_id]:
            info = await self.inspect(sandbox_id)
            if info.state == ContainerState.PAUSED:
                return
            _require_running(info)
            await self._engine_op("pause", self.engine.api.pause, sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        async with self._locks[sandbox_id]:  # not mid-commit either (see pause)
            info = await self.inspect(sandbox_id)
            if info.state == ContainerState.RUNNING:
                return
            if info.state != ContainerState.PAUSED:
                _require_running(info)
            await self._engine_op("resume", self.engine.api.unpause, sandbox_id)

    async def _engine_op(self, what: str, fn: Any, sandbox_id: str) -> None:
        try:
            await self.engine.call(fn, container_name(sandbox_id))
        except DockerNotFound as exc:
            raise NotFound(f"sandbox {sandbox_id} not found") from exc
        except DockerException as exc:
            raise RuntimeFailure(f"cannot {what} sandbox {sandbox_id}: {_explain(exc)}") \
                from exc

    async def list_ids(self) -> set[str]:
        """This sandlot's sandboxes in the engine, found by their labels."""
        ids: set[str] = set()
        for name in await self._container_names():
            sandbox_id = sandbox_of(name)
            if sandbox_id is not None:
                ids.add(sandbox_id)
        return ids

    async def _container_names(self) -> list[str]:
        """Names (without the leading "/") of every container of this sandlot."""
        found = await self.engine.call(
            self.engine.api.containers, all=True,
            filters={"label": [f"{LABEL_OWNER}={self.plan.owner}"]})
        return [n.lstrip("/") for c in found for n in (c.get("Names") or [])[:1]]

    async def _adopt_host_ports(self) -> None:
        """Ports execd of host-network sandboxes from before a restart still listen on."""
        found = await self.engine.call(
            self.engine.api.containers, all=True,
            filters={"label": [f"{LABEL_OWNER}={self.plan.owner}", LABEL_EXECD_PORT]})
        for c in found:
            port = _host_port({"Config": {"Labels": c.get("Labels") or {}}})
            if port is not None:
                self.ports.taken.add(port)

    # -- connect ------------------------------------------------------------------------

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        _check_id(sandbox_id)
        if not 0 < port < 65536:
            raise InvalidRequest(f"port {port} is out of range (1-65535)")
        return await self._connect(sandbox_id, port)

    async def _connect(self, key: str, port: int) -> socket.socket:
        if self.plan.network.kind == NetworkKind.HOST:
            return await self._connect_host(key, port)
        pid = await self._init_pid(key)
        return await self._connector.connect(Path(f"/proc/{pid}/ns/net"), port)

    def _execd_connect(self, key: str) -> execd_client.Connect:
        return lambda: self._connect(key, self.plan.execd_port)

    async def _connect_host(self, sandbox_id: str, port: int) -> socket.socket:
        if port == self.plan.execd_port:
            attrs = await self._attrs(sandbox_id)
            if attrs is None:
                raise NotFound(f"sandbox {sandbox_id} not found")
            host_port = _host_port(attrs)
            if host_port is None:
                raise RuntimeFailure(f"sandbox {sandbox_id} has no execd port label")
            port = host_port
        return await tcp_connect.connect(socket.socket(), "127.0.0.1", port)

    async def _init_pid(self, sandbox_id: str) -> int:
        """The container's init pid, cached while the same process still runs under it."""
        known = self._inits.get(sandbox_id)
        if known is not None and _start_time(known[0]) == known[1]:
            return known[0]
        info = await self._inspect(sandbox_id)
        if info.state == ContainerState.MISSING:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if info.pid is None:
            raise ConnectionRefusedError(f"sandbox {sandbox_id} is {info.state.value}")
        started = _start_time(info.pid)
        if started is None:
            raise ConnectionRefusedError(f"sandbox {sandbox_id}'s init has just exited")
        self._inits[sandbox_id] = (info.pid, started)
        return info.pid

    # -- diagnostics --------------------------------------------------------------------

    async def usage(self, sandbox_id: str) -> ResourceUsage | None:
        _check_id(sandbox_id)
        try:
            pid = await self._init_pid(sandbox_id)
        except (NotFound, ConnectionRefusedError):
            return None
        # The container's cgroup on this host: cheaper than the engine's stats call (which
        # samples for a second) and it has the OOM-kill count the engine does not report.
        return await asyncio.to_thread(cgroupstats.usage_of_pid, pid)

    async def init_log(self, sandbox_id: str, max_bytes: int) -> tuple[bytes, bool] | None:
        _check_id(sandbox_id)
        try:
            data: bytes = await self.engine.call(
                self.engine.api.logs, container_name(sandbox_id), stdout=True, stderr=True,
                tail=2000)
        except DockerNotFound:
            return None
        except DockerException as exc:
            raise RuntimeFailure(f"the Docker engine cannot read the logs of {sandbox_id}: "
                                 f"{_explain(exc)}") from exc
        cut = len(data) > max_bytes
        return cut_to_line(data[-max_bytes:], cut), cut

    def warm_pools(self) -> dict[str, WarmPoolStats]:
        found = {"": self.pool.stats()}
        found.update(self.snapshot_pools.stats())
        return found

    def diagnostic_ids(self, sandbox_id: str) -> dict[str, str]:
        return {"containerName": container_name(sandbox_id)}

    # -- warm pool ----------------------------------------------------------------------

    async def prewarm(self, image: ImageRef) -> None:
        """Keep warm containers of ``image`` if it is a pooled image the engine has.

        Returns at once; the pool fills in the background. Pooled images are not pulled for
        the pool (a create of them pulls, with its own credentials, and prewarms after).
        """
        if not self.pool.wants(Image(name=image.reference, id="", lower_dirs=[])):
            return
        found = await images.lookup(self.engine, image.reference)
        if found is None:
            log.info("warm pool: the Docker engine has no image %s (yet); not pooled",
                     image.reference)
            return
        self.pool.prewarm(_pool_key(image.reference, found))

    def _own_pool(self) -> bool:
        """Take the data dir's pool lock; False when another live runtime (a server) has it.

        Only its holder keeps a warm pool and removes stale warm containers, so a second
        process opening the same data dir (tools, tests) never removes the server's.
        """
        lock_path = self.data_dir / "docker-pool.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self.pool.size = 0
            self.snapshot_pools.size = 0
            return False
        self._pool_lock_fd = fd
        return True

    async def _sweep_pool(self, only: set[str] | None = None) -> None:
        """Remove unclaimed warm containers (left by a crash or a kill -9)."""
        for name in await self._container_names():
            key = name[len(NAME_PREFIX):]
            if pool.is_pool_id(key) and (only is None or key in only):
                try:
                    await self._remove(key)
                except Exception:  # noqa: BLE001 - the next start tries again
                    log.warning("cannot remove stale warm container %s", name, exc_info=True)

    async def _make_warm(self, image: Image) -> pool.Warm:
        key = pool.new_pool_id()
        self._made_warm.add(key)
        token = secrets.token_urlsafe(24)
        spec = SandboxSpec(sandbox_id=key, image=ImageRef(image.name), entrypoint=[],
                           execd_token=token)
        found = await images.lookup(self.engine, image.id)
        if found is None:
            raise RuntimeFailure(f"image {image.name} is gone from the Docker engine")
        try:  # in a background start slot, which the pool holds (oci/pool.WarmPool)
            await self._start(spec, found, pooled=True)
            await execd_client.wait_ready(self._execd_connect(key), None, pool.READY_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._remove(key)
            raise
        return pool.Warm(key, token, image.id)

    async def _claim(self, spec: SandboxSpec, image: images.EngineImage, taken: pool.Warm) -> bool:
        """Give warm container ``taken`` to ``spec``; False (and it is removed) on failure.

        The rename comes first: from then on the container is the sandbox's (a crash leaves
        a sandbox the restart reconciles), and every lookup by name finds it.
        """
        key = taken.container_id
        try:
            await self.engine.call(self.engine.api.rename, container_name(key),
                                   container_name(spec.sandbox_id))
        except DockerException:
            log.warning("claiming warm container %s failed", key, exc_info=True)
            with contextlib.suppress(Exception):
                await self._remove(key)
            return False
        self._inits.pop(key, None)
        try:
            attrs = await self._attrs(spec.sandbox_id)
            if attrs is None:
                raise RuntimeFailure(f"warm container {key} vanished while claimed")
            await self.engine.call(self.engine.api.update_container, attrs["Id"],
                                   **warm.limits(spec, self.plan.swap_limit))
            await asyncio.to_thread(warm.set_identity, attrs, spec.sandbox_id)
            await execd_client.claim(self._execd_connect(spec.sandbox_id), taken.token,
                                     env=warm.claim_env(spec, image, self.plan),
                                     token=spec.execd_token, entrypoint=list(spec.entrypoint))
        except Exception:  # noqa: BLE001 - fall back to a cold create
            log.warning("claiming warm container %s for %s failed", key, spec.sandbox_id,
                        exc_info=True)
            with contextlib.suppress(Exception):
                await self._remove(spec.sandbox_id)
            return False
        except BaseException:
            with contextlib.suppress(Exception):
                await self._remove(spec.sandbox_id)
            raise
        return True

    # -- containers changing behind the server's back -----------------------------------

    def watch(self, changed: StateListener) -> None:
        """Follow the engine's die/destroy events; report sandboxes that stopped or went."""
        if self._events is not None:
            return
        loop = asyncio.get_running_loop()

        async def report(sandbox_id: str) -> None:
            info = await self.inspect(sandbox_id)
            if info.state in (ContainerState.MISSING, ContainerState.STOPPED):
                self._inits.pop(sandbox_id, None)
                await changed(sandbox_id, info)

        def spawn(sandbox_id: str) -> None:
            task = loop.create_task(report(sandbox_id))
            self._reports.add(task)
            task.add_done_callback(self._reported)

        def seen(sandbox_id: str) -> None:  # on the event thread
            loop.call_soon_threadsafe(spawn, sandbox_id)

        self._events = ContainerEvents(self.engine.api, self.plan.owner, seen)
        self._events.start()

    # -- volumes and snapshots -----------------------------------------------------------

    async def check_volumes(self, volumes: list[VolumeSpec]) -> None:
        await self.volumes.check(volumes)

    async def _sweep_volumes(self) -> None:
        """Release volumes of sandboxes whose container is gone (a crash mid-create)."""
        live = await self.list_ids()
        for sandbox_id in self.volumes.holders() - live:
            try:
                await self.volumes.release(sandbox_id)
            except Exception:  # noqa: BLE001 - the next start tries again
                log.warning("cannot release volumes of %s", sandbox_id, exc_info=True)

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> None:
        """Commit the container (paused for the copy; a paused sandbox stays paused)."""
        _check_id(sandbox_id)
        async with self._locks[sandbox_id]:
            info = await self._inspect(sandbox_id)
            if info.state not in (ContainerState.RUNNING, ContainerState.PAUSED):
                _require_running(info)
            attrs = await self._attrs(sandbox_id)
            if attrs is None:
                raise NotFound(f"sandbox {sandbox_id} not found")
            await snapshots.commit(self.engine, attrs, snapshot_id)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        # Its warm containers go first (the engine refuses to remove an image in use).
        async with self.snapshot_pools.draining(snapshot_id):
            await snapshots.remove(self.engine, snapshot_id)

    def _reported(self, task: asyncio.Task[None]) -> None:
        self._reports.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("reporting a container change failed", exc_info=task.exception())

    async def close(self) -> None:
        """Stop refilling and remove the unclaimed warm containers (a start makes new ones)."""
        await self.snapshot_pools.stop()
        for key in await self.pool.stop():
            with contextlib.suppress(Exception):
                await self._remove(key)
        with contextlib.suppress(Exception):
            await self._sweep_pool(only=set(self._made_warm))
        if self._pool_lock_fd is not None:
            os.close(self._pool_lock_fd)
            self._pool_lock_fd = None
        if self._events is not None:
            await asyncio.to_thread(self._events.stop)
        for task in list(self._reports):
            task.cancel()
        self._connector.close()
        self.engine.close()


def _engine_runtime(cfg: Config, info: dict[str, Any]) -> str | None:
    """The engine runtime ``[secure_runtime]`` asks for (upstream: ``docker_runtime``).

    ``[secure_runtime]`` is read only if this sandlot's config model has it (issue 10's
    gVisor part adds it); an asked-for runtime the engine does not have refuses the start,
    never a silent fall-back to the engine's default (runc).
    """
    secure = getattr(cfg, "secure_runtime", None)
    kind = str(getattr(secure, "type", "") or "")
    if not kind:
        return None
    name = getattr(secure, "docker_runtime", None)
    if not name:
        raise RuntimeFailure(f'[secure_runtime] type = "{kind}" on the docker runtime needs '
                             'docker_runtime, the engine runtime to use (e.g. "runsc")')
    known = sorted((info.get("Runtimes") or {}).keys())
    if name not in known:
        raise RuntimeFailure(
            f"[secure_runtime] docker_runtime = {name!r}: the Docker engine has no such "
            f"runtime (it has {', '.join(known) or 'none'}); register it in the engine's "
            'daemon.json ("runtimes") and restart dockerd'
        )
    return str(name)


async def _require_network(engine: Engine, name: str) -> None:
    try:
        await engine.call(engine.api.inspect_network, name)
    except DockerNotFound as exc:
        raise RuntimeFailure(
            f"[docker] network_mode {name!r}: the Docker engine has no such network; create "
            f"it first (docker network create {name})"
        ) from exc


def _pool_key(reference: str, image: images.EngineImage) -> Image:
    """What the warm pool knows an image by: the name asked for and the engine's id."""
    return Image(name=reference, id=image.id, lower_dirs=[])


def _host_port(attrs: dict[str, Any]) -> int | None:
    value = ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_EXECD_PORT)
    return int(value) if value and str(value).isdigit() else None


def _explain(exc: DockerException) -> str:
    return str(getattr(exc, "explanation", None) or exc)


def _check_id(sandbox_id: str) -> None:
    # Container names allow [a-zA-Z0-9][a-zA-Z0-9_.-]; sandbox ids are UUIDs or alike.
    if not sandbox_id or not (sandbox_id[0].isalnum() and all(
            c.isalnum() or c in "_.-" for c in sandbox_id)) or len(sandbox_id) > 128:
        raise InvalidRequest(f"invalid sandbox id {sandbox_id!r}: use letters, digits, '_.-'")


def _check_spec(spec: SandboxSpec) -> None:
    _check_id(spec.sandbox_id)
    if spec.network_policy is not None:
        raise Unsupported("networkPolicy is not supported by the docker runtime")


def _require_running(info: ContainerInfo) -> None:
    if info.state == ContainerState.MISSING:
        raise NotFound(f"sandbox {info.sandbox_id} not found")
    if info.state != ContainerState.RUNNING:
        raise Conflict(f"sandbox {info.sandbox_id} is {info.state.value}, not running")

