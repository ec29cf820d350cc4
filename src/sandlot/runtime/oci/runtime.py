"""``OciRuntime``: sandboxes as OCI containers driven through runc, with no daemon.

Everything a sandbox owns lives under ``data_dir/sandboxes/<id>/`` (bundle, overlay upper and
work dirs, logs) plus its runc state under ``data_dir/runc``, its network
namespace ``/run/netns/sandlot-<hash>`` and its cgroups ``.../sandlot/<id>``. Containers are
started detached with their stdio in files, so they survive a restart (or ``kill -9``) of
the server, and ``list_ids`` finds them again from runc's state directory.

execd listens on TCP on the loopback of the sandbox's network namespace; ``connect`` makes a
socket inside that namespace (setns on a worker thread), so no host path the sandbox can
write is ever followed. Images are resolved here, from the local image store (pulled into it
when missing).

With a warm pool (``oci/pool.py``) a sandbox may run in a container named ``_pool-<hex>``:
every public method takes the sandbox id and resolves it to its container id first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from sandlot import datadir
from sandlot.config import Config
from sandlot.errors import (
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    RuntimeFailure,
    Unsupported,
)
from sandlot.images.model import Image, ImageConfig, RegistryAuth
from sandlot.net import hostmode
from sandlot.net.manager import NetworkManager
from sandlot.net.policy import coerce as coerce_policy
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
    VolumeSpec,
    WarmPoolStats,
)
from sandlot.runtime.execd_bundle import MOUNT_POINT, ExecdBundle, ensure_bundle
from sandlot.runtime.logtail import tail_file
from sandlot.runtime.oci import (
    cgroups,
    claimops,
    disklimit,
    handoff,
    hibernate,
    idmap,
    imageuser,
    leftovers,
    mounts,
    netns,
    pool,
    removal,
    runsc,
    uidrange,
    volumes,
    zygote,
)
from sandlot.runtime.oci import spec as ocispec
from sandlot.runtime.oci.binary import OciBinary, choose_binary, flavor_of
from sandlot.runtime.oci.layout import SandboxPaths, claims_folder, netns_name, rootfs_folder
from sandlot.runtime.oci.pausemode import PauseModes
from sandlot.runtime.oci.runc import Runc, RuncError
from sandlot.runtime.oci.snapshot_pools import SnapshotPools
from sandlot.runtime.oci.snapshots import SnapshotLayers
from sandlot.server.quantity import parse_ephemeral_storage

log = logging.getLogger(__name__)
_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
HOST_PLATFORM = "linux/" + _ARCHES.get(os.uname().machine, os.uname().machine)


class ImageSource(Protocol):
    """What the runtime needs of an image store (``ImageStore``; tests pass their own)."""

    def get(self, name: str) -> Image | None: ...

    async def pull(self, name: str, auth: RegistryAuth | None = None,
                   progress: Any = None) -> Any: ...

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_STATES = {
    "creating": ContainerState.CREATED,  # runc: its init is still being set up
    "created": ContainerState.CREATED,
    "running": ContainerState.RUNNING,
    "paused": ContainerState.PAUSED,
    "stopped": ContainerState.STOPPED,
}


def _check_id(sandbox_id: str) -> None:
    if not _ID_RE.match(sandbox_id):
        raise InvalidRequest(f"invalid sandbox id {sandbox_id!r}: use letters, digits, '_.-'")


def _refuse_policy_in_host_mode(policy: object) -> None:
    """Mode host enforces nothing: a policy that restricts anything is refused, not ignored."""
    if policy is not None and not coerce_policy(policy).allows_everything:
        raise Unsupported('networkPolicy cannot be enforced: this server runs with [network] '
                          'mode = "host" (sandboxes share its network namespace, unfenced)')


async def _connect_loopback(port: int) -> socket.socket:
    """A non-blocking TCP socket connected to ``127.0.0.1:port`` of the server's namespace."""
    return await tcp_connect.connect(socket.socket(), "127.0.0.1", port)


def _swap_limit_supported() -> bool:
    if cgroups.is_unified_only():
        return True
    return Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()


def _user_namespaces_wanted(cfg: Config, binary: str) -> bool:
    """``[runtime] user_namespaces``: "auto" (on where runc and the kernel support the
    idmapped layers it needs), true (required: refuse to start without) or false."""
    wanted = cfg.runtime.user_namespaces
    if wanted is False or Path(binary).name == "runsc":  # gVisor has its own user model
        return False
    ok = idmap.supported()
    if wanted is True and not ok:
        raise RuntimeFailure("[runtime] user_namespaces = true, but this kernel cannot "
                             "idmap mounts (Linux >= 5.19 is needed)")
    return ok


class OciRuntime(Runtime):
    """The default runtime backend (see module docstring)."""

    name = "oci"

    def __init__(
        self,
        data_dir: Path,
        binary: str,
        bundle: ExecdBundle,
        pids_limit: int,
        warm_pool_size: int = 0,
        warm_pool_images: list[str] | None = None,
        *,
        images: ImageSource,
        execd_port: int = execd_client.DEFAULT_PORT,
        network: NetworkManager | None = None,
        host_network: bool = False,
        allowed_host_paths: list[str] | None = None,
        default_disk_bytes: int | None = None,
        runsc_platform: str = "ptrace",
        pause_mode: str = "freeze",
        user_namespaces: bool = False,
        max_concurrent_starts: int = 0,
        execd_launch: str = "zygote",
        snapshot_pool_size: int = 0,
        snapshot_pools_max: int = 4,
        snapshot_pool_idle_seconds: float = 600.0,
    ) -> None:
        self.data_dir = data_dir
        # Cold starts and warm-pool refills queue here (admission.py): a burst of creates
        # runs a few starts at a time instead of all of them slowly.
        self.starts = StartGate(max_concurrent_starts)
        # Root in a sandbox is an unprivileged host uid range of its own (see uidrange.py).
        self.user_namespaces = user_namespaces
        self.ranges = uidrange.UidRanges(data_dir / "sandboxes")
        self._userns_fds: dict[int, int] = {}  # uid base -> user namespace fd (reused)
        self._roots_dir = rootfs_folder(data_dir)
        self.images = images
        self.execd_port = execd_port
        self.binary = OciBinary(binary, flavor_of(binary))
        self.gvisor = self.binary.is_gvisor
        # execd_launch = "zygote": runc sandboxes with a user namespace get an execd forked
        # from the zygote (oci/zygote.py); the others start it with runc as before.
        self.zygote: zygote.Zygotes | None = None
        self._waiter = ""
        if execd_launch == "zygote" and not self.gvisor:
            missing = zygote.unavailable_reason(bundle)
            if missing is None:
                self._waiter = zygote.waiter_binary() or ""
                self.zygote = zygote.Zygotes(bundle)
                if user_namespaces:  # the zygote's sandboxes: starts are mostly waiting
                    self.starts = StartGate(max_concurrent_starts,
                                            per_cpu=admission.ZYGOTE_SLOTS_PER_CPU)
            else:
                log.warning('[runtime] execd_launch = "zygote" is not possible here (%s): '
                            "every sandbox starts execd with runc", missing)
        # A policy is enforced in mode "isolated" and trivially met in "none" (nothing
        # leaves the sandbox); in "host" nothing can be enforced: a create carrying one is
        # refused (400, as the reference's Docker host network does).
        self.capabilities = RuntimeCapabilities(
            # Hibernation needs gVisor and, for now, no outbound network: a restored netstack
            # would come back without the sandbox's veth address (not re-applied yet).
            pause=True, snapshots=True, pools=True, hibernate=self.gvisor and network is None,
            isolation=self.binary.isolation,
            platforms=frozenset({HOST_PLATFORM}), network_policy=not host_network,
            volume_kinds=frozenset({"host", "pvc"}), disk_limit=True,
            pvc_size=True,
        )
        self.allowed_host_paths = list(allowed_host_paths or [])
        self.pvcs = volumes.PvcStore(data_dir / "volumes")
        # Warm containers get the configured default cap, so creates that ask for no other
        # size are still served from the pool.
        self.default_disk_bytes = default_disk_bytes
        self.runc = Runc(binary, data_dir / "runc", gvisor=self.gvisor,
                         global_args=runsc.global_args(runsc_platform) if self.gvisor else ())
        self.pause_modes = PauseModes(default=pause_mode, gvisor=self.gvisor,
                                      networked=network is not None)
        self.bundle = bundle
        self.pids_limit = pids_limit
        self._swap = _swap_limit_supported()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._connector = netns.NetnsConnector()
        self.claims = pool.ClaimStore(claims_folder(data_dir))
        # Warm starts run in the gate's background slots, taken by the pools (pool.py).
        self.pool = pool.WarmPool(warm_pool_size, list(warm_pool_images or []),
                                  self._make_warm, self._teardown,
                                  parallel=self._refills_at_once(), gate=self.starts)
        self._made_warm: set[str] = set()  # warm containers this instance started
        self.leftovers = leftovers.BackgroundSweep()  # a crashed server's warm containers
        self._removals = removal.BackgroundRemovals()  # deleted sandboxes' directories
        self.snapshots = SnapshotLayers(data_dir / "snapshots")
        # Warm containers of the snapshots sandboxes are created from (snapshot_pools.py).
        self.snapshot_pools = SnapshotPools(snapshot_pool_size, snapshot_pools_max,
                                            snapshot_pool_idle_seconds, self._make_warm,
                                            self._teardown, parallel=self._refills_at_once(),
                                            gate=self.starts)
        # Named pools (``/v1/pools``): pool name -> its warm pool and the image name it keeps.
        self.named_pools: dict[str, tuple[pool.WarmPool, str]] = {}
        self._pool_lock_fd: int | None = None
        self.network = network  # set in mode "isolated"
        self.host_network = host_network  # mode "host": the server's namespace (hostmode)

    @classmethod
    async def open(cls, cfg: Config, images: ImageSource | None = None) -> OciRuntime:
        """Check the host, build (or reuse) the execd bundle, and return the runtime.

        ``images`` defaults to the image store in ``data_dir/images``.
        """
        binary = choose_binary(cfg)
        if shutil.which("ip") is None:
            raise RuntimeFailure("iproute2's 'ip' is required for sandbox network namespaces")
        if binary.is_gvisor and shutil.which("unshare") is None:
            raise RuntimeFailure("util-linux's 'unshare' is required to start runsc sandboxes")
        if cfg.runtime.pause_mode == "hibernate" and cfg.network.mode == "isolated":
            raise RuntimeFailure(
                '[runtime] pause_mode = "hibernate" is not available with [network] mode = '
                '"isolated" yet (a restored sandbox would lose its outbound address); use '
                'mode = "none" or pause_mode = "freeze"')
        if cfg.runtime.pause_mode == "hibernate" and not binary.is_gvisor:
            raise RuntimeFailure(
                '[runtime] pause_mode = "hibernate" needs gVisor ([secure_runtime] type = '
                f'"gvisor"); {binary.flavor} can only freeze')
        data_dir = cfg.data_dir
        datadir.create(data_dir)
        for sub in ("sandboxes", "runc"):
            (data_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir / "runc", 0o700)
        await asyncio.to_thread(removal.sweep_trash, data_dir / "sandboxes")
        bundle = await asyncio.to_thread(
            ensure_bundle, data_dir / "execd-bundle",
            lambda: bundle_prune.named_in_oci_configs(data_dir, MOUNT_POINT))
        if images is None:
            from sandlot.images.store import ImageStore

            images = ImageStore(root=data_dir / "images",
                                insecure_registries=cfg.images.insecure_registries)
        network = None
        if cfg.network.mode == "isolated":
            network = await NetworkManager.open(cfg, data_dir)
        # The same default the server's bounds give a create (bounds.py), so warm
        # containers match the creates that name no other size.
        default_disk = (cfg.runtime.default_resources.get("ephemeral-storage")
                        or cfg.runtime.default_ephemeral_storage)
        userns = await asyncio.to_thread(_user_namespaces_wanted, cfg, binary.path)
        platform = ""
        if binary.is_gvisor:
            platform = await runsc.resolve_platform(binary.path, cfg.runtime.runsc_platform)
            log.info("gVisor platform: %s", platform)
        rt = cls(data_dir, binary.path, bundle, cfg.runtime.pids_limit,
                 cfg.runtime.warm_pool_size, cfg.runtime.warm_pool_images,
                 images=images, execd_port=cfg.execd.port,
                 network=network, host_network=cfg.network.mode == "host",
                 allowed_host_paths=cfg.storage.allowed_host_paths,
                 default_disk_bytes=parse_ephemeral_storage(default_disk) if default_disk else None,
                 runsc_platform=platform, pause_mode=cfg.runtime.pause_mode,
                 user_namespaces=userns,
                 max_concurrent_starts=cfg.runtime.max_concurrent_starts,
                 execd_launch=cfg.runtime.execd_launch,
                 snapshot_pool_size=cfg.runtime.snapshot_pool_size,
                 snapshot_pools_max=cfg.runtime.snapshot_pools_max,
                 snapshot_pool_idle_seconds=cfg.runtime.snapshot_pool_idle_seconds)
        if cfg.runtime.execd_launch == "zygote" and (binary.is_gvisor or not userns):
            log.warning('[runtime] execd_launch = "zygote" applies to runc sandboxes with a '
                        "user namespace only; every sandbox here starts execd with %s",
                        binary.flavor)
        if rt._own_pool_dir():
            # Leftovers of a crash (nobody else owns them): removed once the server answers,
            # their leases and uid ranges held until then (leftovers.py).
            stale = rt._stale_warm()
            for cid in rt.runc.ids() - stale:  # a forked start a crash cut short (zygote.py)
                await asyncio.to_thread(zygote.stop_if_half_started, rt.runc.root, cid,
                                        SandboxPaths.of(data_dir, cid).config_json)
            await rt._thaw_interrupted_snapshots()
            if network is not None:
                await network.restore(rt._container_ids() - stale, keep=stale)
            else:
                await NetworkManager.remove_all(cfg, data_dir)  # left by mode "isolated"
            # a rootfs mount point's folder that a crash left renamed (after its unmount)
            await asyncio.to_thread(removal.sweep_trash, rt._roots_dir)
            rt.leftovers.start(stale, rt._teardown)
            if rt.zygote is not None and rt.user_namespaces:  # the sandboxes it serves
                try:
                    await rt.zygote.start()
                except OSError as exc:  # the first launch tries again (and fails its create)
                    log.warning("could not start the execd zygote: %s", exc)
        return rt

    async def _thaw_interrupted_snapshots(self) -> None:
        """Resume containers a snapshot froze for its copy when the server died meanwhile:
        nobody asked for them to be paused (the snapshot itself is failed by the server)."""
        for cid in sorted(self._container_ids()):
            mark = SandboxPaths.of(self.data_dir, cid).snapshot_freeze
            if not mark.exists():
                continue
            try:
                st = await self.runc.state(cid)
            except RuncError:  # unknown now: the mark stays for the next start to retry
                log.exception("could not read the state of %s, frozen by a snapshot", cid)
                continue
            if st is not None and st.get("status") == "paused":
                log.warning("resuming %s: a snapshot froze it and the server stopped", cid)
                await self.runc.resume(cid)
            mark.unlink(missing_ok=True)

    def _own_pool_dir(self) -> bool:
        """Take the data dir's pool lock; False when another live runtime (a server) holds it.

        Only the owner keeps a warm pool and sweeps stale warm containers, so a second process
        opening the same data dir (tools, tests) never removes the server's warm containers.
        """
        lock_path = self.data_dir / "pool" / "owner.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
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

    def container_id(self, sandbox_id: str) -> str:
        """The runc container a sandbox runs in: its own id, or a claimed warm container's."""
        return self.claims.get(sandbox_id) or sandbox_id

    def paths(self, sandbox_id: str) -> SandboxPaths:
        return SandboxPaths.of(self.data_dir, self.container_id(sandbox_id))

    # -- images -------------------------------------------------------------------------

    async def resolve_image(self, ref: ImageRef, progress: Progress | None = None) -> Image:
        """The local image for ``ref``, pulled (with its credentials) when not stored."""
        if ref.platform is not None and ref.platform != HOST_PLATFORM:
            raise InvalidRequest(f"platform {ref.platform} cannot be satisfied: this host runs "
                                 f"{HOST_PLATFORM}")
        image = self.images.get(ref.reference)
        if image is not None:
            return image
        if progress is not None:
            await progress("Pulling", f"pulling image {ref.reference}")
        pulled = await self.images.pull(ref.reference, ref.auth, None)
        if isinstance(pulled, Image):
            return pulled
        image = self.images.get(ref.reference)
        if image is None:
            raise ImageNotFound(f"image {ref.reference} is not available after pulling it")
        return image

    # -- create -------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, progress: Progress | None = None) -> CreateResult:
        _check_id(spec.sandbox_id)
        if spec.snapshot_id is not None:
            image = await asyncio.to_thread(self.snapshots.image, spec.snapshot_id)
        else:
            image = await self.resolve_image(spec.image, progress)
        if progress is not None:
            await progress("Starting", "starting the container")
        async with contextlib.AsyncExitStack() as slot:
            async with self._locks[spec.sandbox_id]:
                p = SandboxPaths.of(self.data_dir, spec.sandbox_id)
                if (p.root.exists() or self.runc.has_state(spec.sandbox_id)
                        or self.claims.get(spec.sandbox_id)):
                    raise Conflict(f"sandbox {spec.sandbox_id} already exists")
                mode = self.pause_modes.of_spec(spec)
                if self.host_network:  # before a warm container is claimed
                    _refuse_policy_in_host_mode(spec.network_policy)
                if spec.snapshot_id is not None:  # before the container: delete sees the use
                    self.snapshots.add_user(spec.snapshot_id, spec.sandbox_id)
                # A warm container has no volumes (its mounts are made) and the default cap.
                poolable = not spec.volumes and spec.disk_bytes == self.default_disk_bytes
                warm = await self._take_warm(spec, image) if poolable else None
                if warm is not None and await self._claim(spec, image, warm):
                    self.pause_modes.record(self.paths(spec.sandbox_id), mode)
                    return CreateResult(execd_ready=True)  # its execd just answered the claim
                try:
                    await slot.enter_async_context(self.starts.slot())
                    await self._create(spec, image, p)
                except BaseException as exc:
                    with contextlib.suppress(Exception):
                        await self._teardown(spec.sandbox_id)
                    self.snapshots.remove_user(spec.sandbox_id)
                    if isinstance(exc, RuntimeFailure | InvalidRequest):
                        raise
                    if isinstance(exc, Exception):
                        raise RuntimeFailure(
                            f"cannot start sandbox {spec.sandbox_id}: {exc}") from exc
                    raise
                self.pause_modes.record(p, mode)
            # Still in the slot (execd's start-up is most of a start's CPU), but no longer
            # holding the sandbox's lock: a delete need not wait for the start-up.
            return CreateResult(execd_ready=await self._wait_started(spec))

    def _refills_at_once(self) -> int:
        """Warm starts a pool may run at once: half the start slots. Refills take their
        slots only while no create waits (admission.py), so a drained pool refills as fast
        as the machine has room for, and half the slots stay free for creates that come."""
        return max(1, self.starts.slots // 2)

    async def _wait_started(self, spec: SandboxSpec) -> bool:
        return await admission.started(
            self._execd_connect(spec.sandbox_id), spec.execd_token,
            ended=admission.container_ended(self.inspect, spec.sandbox_id))

    async def _create(
        self, spec: SandboxSpec, image: Image, p: SandboxPaths, pooled: bool = False
    ) -> None:
        for d in (p.rootfs, p.rw, p.etc):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(p.root, 0o700)  # the upper dir holds the workload's files
        if spec.disk_bytes is not None:
            await disklimit.mount_limited(p.root, p.rw, spec.disk_bytes)
        for d in (p.upper, p.work):
            d.mkdir(exist_ok=True)
        # Root in the sandbox is an unprivileged host uid range (uidrange.py); its volumes
        # are idmapped binds into that range (volumes.owner_bind).
        uid_base = (self.ranges.allocate(spec.sandbox_id, p.root) if self.user_namespaces
                    else None)
        staged = (await asyncio.to_thread(volumes.stage, spec.volumes, p.root, spec.sandbox_id,
                                          self.pvcs, self.allowed_host_paths, uid_base)
                  if spec.volumes else [])
        (p.upper / ocispec.WORKSPACE.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
        host = ocispec.hostname(spec)
        (p.etc / "hostname").write_text(host + "\n")
        (p.etc / "hosts").write_text(
            f"127.0.0.1\tlocalhost {host}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        (p.root / "image.json").write_text(json.dumps({
            "name": image.name, "id": image.id,
            "lower_dirs": [str(d) for d in image.lower_dirs],
            "config": dataclasses.asdict(image.config),
        }))  # what a snapshot of this sandbox stands on
        ns: Path | None = None
        execd_port = self.execd_port
        if self.host_network:
            execd_port = hostmode.allocate_port(p.root)
            shutil.copyfile("/etc/resolv.conf", p.etc / "resolv.conf")
        else:
            ns = await netns.create_netns(netns_name(spec.sandbox_id),
                                          reserved_ports=(execd_port,))
        # With execd forked in after runc (the zygote's plan), nothing of the sandbox runs
        # before that launch: the network is set up meanwhile, beside the overlay mount and
        # runc, and awaited before it. runsc reads the namespace's interfaces when it boots,
        # and an execd runc starts itself starts the workload: both wait for it.
        network_setup: asyncio.Task[object] | None = None
        if self.network is not None and ns is not None:
            policy = None if pooled else spec.network_policy
            self.network.reserve(spec.sandbox_id)
            (p.etc / "resolv.conf").write_text(self.network.resolv_conf(spec.sandbox_id))
            setup = self.network.setup(spec.sandbox_id, ns, policy)
            if self.zygote is not None and uid_base is not None and not self.gvisor:
                network_setup = asyncio.ensure_future(setup)
            else:
                await setup
        try:
            await self._start_container(spec, image, p, ns, uid_base, execd_port, staged,
                                        pooled, network_setup)
        finally:
            if network_setup is not None:
                if not network_setup.done():
                    # a failed start's clean-up (network teardown) must come after the set-up
                    await asyncio.wait([network_setup])
                if not network_setup.cancelled():
                    network_setup.exception()  # seen: a failed start raises its own error

    async def _start_container(self, spec: SandboxSpec, image: Image, p: SandboxPaths,
                               ns: Path | None, uid_base: int | None, execd_port: int,
                               staged: list[volumes.StagedVolume], pooled: bool,
                               network_setup: asyncio.Task[object] | None) -> None:
        """Mount the rootfs, write the bundle and run it; execd comes forked in once
        ``network_setup`` (if any) is done."""
        if self.gvisor:
            await runsc.create_access(netns_name(spec.sandbox_id))
        lowers = list(image.lower_dirs)
        if uid_base is not None:
            lowers = self._shift_owners(p, lowers, uid_base, await self._userns_fd(uid_base))
            rootfs = self._make_rootfs_dir(spec.sandbox_id, uid_base)
        else:
            rootfs = p.rootfs
        mounts.mount_overlay(lowers, p.upper, p.work, rootfs)
        limited = SandboxSpec(**{**spec.__dict__, "pids_limit": self._host_pids(spec)})
        config = ocispec.build_config(limited, image, self.bundle, netns=ns, etc_dir=p.etc,
                                      swap_limit=self._swap, execd_port=execd_port,
                                      execd_host=runsc.GVISOR_ADDR if self.gvisor else None,
                                      execd_handoff=self._hands_off,
                                      uid_base=uid_base,
                                      user=imageuser.resolve_user(image.config.user,
                                                                  list(image.lower_dirs)))
        config["root"]["path"] = str(rootfs)
        if self.network is not None or self.host_network:
            config["mounts"].append({
                "destination": "/etc/resolv.conf", "type": "bind",
                "source": str(p.etc / "resolv.conf"),
                "options": ["bind", "ro", "nosuid", "nodev", "noexec"]})
        config["mounts"] += volumes.oci_mounts(staged)
        if pooled:
            args = config["process"]["args"]
            args.insert(args.index("sandlot.execd") + 1, "--pooled")
            # A warm container starts (and idles) in the background: it yields the CPU to
            # sandboxes in use; the claim restores the normal weight.
            config["linux"].setdefault("resources", {}).setdefault("cpu", {})["shares"] = (
                claimops.WARM_CPU_SHARES
            )
        plan = None
        if self.zygote is not None and uid_base is not None:
            plan = zygote.use_waiter(config, self._waiter)  # PID 1 waits; execd comes forked
            await self.zygote.start_for(plan["process"])
        # Compact: with indent the pure-Python encoder ran (~0.8 ms of the loop per create,
        # against ~0.13 ms for the C one); nothing reads it but parsers.
        p.config_json.write_text(json.dumps(config, separators=(",", ":")))
        await self.runc.run_detached(spec.sandbox_id, p.bundle, p.container_log, p.runc_log,
                                     secret=b"" if plan else (spec.execd_token or "").encode())
        if network_setup is not None:
            await network_setup
        if plan is not None and self.zygote is not None:
            await self.zygote.launch(claimops.init_pid(self.runc.root, spec.sandbox_id),
                                     spec.sandbox_id, plan, spec.execd_token or "",
                                     p.container_log)

    async def _userns_fd(self, base: int) -> int:
        """The user namespace mapping ``base``'s range, made once per range and kept.

        Made on a worker thread: it starts a helper process and waits for it to enter its
        namespace, which in a burst of creates (a new range each) waited for a busy CPU on
        the event loop, stalling every request in flight."""
        fd = self._userns_fds.get(base)
        if fd is not None:
            return fd
        made = await asyncio.to_thread(idmap.userns_fd, base, uidrange.RANGE_SIZE)
        fd = self._userns_fds.setdefault(base, made)
        if fd != made:  # the range was released and taken again meanwhile: one copy kept
            os.close(made)
        return fd

    def _shift_owners(self, p: SandboxPaths, lowers: list[Path], base: int,
                      userns_fd: int) -> list[Path]:
        """Idmapped views of the image layers, and the sandbox's own writable dirs, owned by
        its uid range (through ``userns_fd``): root inside owns what host root owns, nothing
        is copied."""
        shifted = []
        for i, layer in enumerate(lowers):
            target = p.lower / str(i)
            target.mkdir(parents=True, exist_ok=True)
            idmap.idmapped_bind(layer, target, userns_fd)
            shifted.append(target)
        for d in (p.upper, p.upper / ocispec.WORKSPACE.lstrip("/"), p.etc,
                  p.etc / "hosts", p.etc / "hostname"):
            os.chown(d, base, base)
        return shifted

    def rootfs_of(self, container_id: str) -> Path:
        """Where a container's overlay is mounted.

        With user namespaces runc sets the root file system up from inside the namespace,
        as the sandbox's root: the path must be traversable by that (unprivileged) host uid,
        while the data dir is root-only. So the overlay goes below ``ROOTS_DIR`` (0711: no
        listing), in a directory of the container's own that only its range may enter.
        """
        if self.ranges.base_of(container_id) is None:  # no user namespace
            return SandboxPaths.of(self.data_dir, container_id).rootfs
        return self._roots_dir / container_id / "rootfs"

    def _make_rootfs_dir(self, container_id: str, base: int) -> Path:
        self._roots_dir.mkdir(parents=True, exist_ok=True)
        for d in (self._roots_dir.parent, self._roots_dir):
            os.chmod(d, 0o711)
        own = self._roots_dir / container_id
        own.mkdir(mode=0o700, exist_ok=True)
        os.chown(own, base, base)
        rootfs = own / "rootfs"
        rootfs.mkdir(exist_ok=True)
        return rootfs

    async def set_network_policy(self, sandbox_id: str, policy: object) -> None:
        """Enforce ``policy`` for a running sandbox at once (no restart of anything)."""
        _check_id(sandbox_id)
        if self.host_network:
            _refuse_policy_in_host_mode(policy)
        if self.network is None:
            return  # mode none: nothing leaves the sandbox whatever the policy says
        await self.network.set_policy(self.container_id(sandbox_id), policy)

    async def check_volumes(self, specs: list[VolumeSpec]) -> None:
        """400 at once for a missing pvc or a subPath that leads out of one through a link
        (``stage`` checks again, without following links, when it mounts)."""
        for v in specs:
            if v.kind == "pvc":
                await asyncio.to_thread(self.pvcs.check, v)

    # -- delete -------------------------------------------------------------------------

    async def delete(self, sandbox_id: str) -> None:
        _check_id(sandbox_id)
        async with self._locks[sandbox_id]:
            await self._teardown(self.container_id(sandbox_id))
            self.claims.remove(sandbox_id)  # only once the container is gone
            self.snapshots.remove_user(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def _teardown(self, sandbox_id: str) -> None:
        """Remove every trace of a container, whatever state a crash left it in."""
        p = SandboxPaths.of(self.data_dir, sandbox_id)
        await hibernate.settle(sandbox_id)  # a just-hibernated one's deferred runsc delete
        emptied = await asyncio.to_thread(cgroups.kill_all, sandbox_id)
        if not emptied or self.gvisor:
            # With no process left, all runc's delete would do is remove the container's
            # cgroups and its state: both are done below, without a fork and exec of runc
            # (~18 ms of a delete's ~50 on the 2-core VM, ~30 while warm starts run).
            # runsc's sandbox and gofer also hold host state of their own: it deletes them.
            await self.runc.delete_force(sandbox_id)
        await asyncio.to_thread(cgroups.remove_sandbox_cgroups, sandbox_id)
        # only once the container is gone; raises if a volume stays mounted
        await asyncio.to_thread(volumes.unstage, p.root, sandbox_id, self.pvcs)
        own_root = self._roots_dir / sandbox_id
        # In a worker: mountinfo grows with every sandbox and an overlay's umount can wait
        # on its writes; the event loop serves the other requests meanwhile (profiled: these
        # steps were ~15 % of the loop's busy samples in 10-claim bursts with their deletes).
        await asyncio.to_thread(mounts.unmount_all_under, own_root, p.root)
        if self.network is not None:
            await self.network.teardown(sandbox_id)
        if self.gvisor:
            await runsc.delete_access(netns_name(sandbox_id))
        await asyncio.to_thread(removal.remove_tree, own_root)
        await netns.delete_netns(netns_name(sandbox_id))
        # if runc could not (e.g. its init already gone)
        await asyncio.to_thread(self.runc.remove_state, sandbox_id)
        left = await asyncio.to_thread(mounts.mounts_under, p.root)
        if left:  # never rmtree through a mount (a volume's or the host's files)
            raise RuntimeFailure(f"sandbox {sandbox_id}: still mounted: {', '.join(left)}")
        trash = await asyncio.to_thread(removal.set_aside, p.root)
        if trash is not None:
            self._removals.remove(trash)
        self.ranges.release(sandbox_id)

    # -- named pools --------------------------------------------------------------------

    async def _take_warm(self, spec: SandboxSpec, image: Image) -> pool.Warm | None:
        """A warm container for ``spec``: from the pool it names first, else of its
        snapshot's pool (a create from a snapshot naming no pool), else the server's. A
        pool with none ready gives one it is starting (``WarmPool.claim``)."""
        named = self.named_pools.get(spec.extensions.get("poolRef", ""))
        warm = await named[0].claim(image) if named is not None else None
        if warm is None and named is None and spec.snapshot_id is not None:
            return await self.snapshot_pools.claim(spec.snapshot_id, image)
        return warm if warm is not None else await self.pool.claim(image)

    async def ensure_pool(self, name: str, image: ImageRef, size: int,
                          snapshot_id: str | None = None,
                          limits: dict[str, str] | None = None) -> None:
        # ``limits`` are applied at claim (claimops), like any create's.
        if snapshot_id is not None:
            local = await asyncio.to_thread(self.snapshots.image, snapshot_id)
        else:
            local = await self.resolve_image(image)
        if self._pool_lock_fd is None:  # another process owns the data dir's pools
            raise Conflict("this runtime does not own the data dir's pools (another server "
                           "serves it)")
        current = self.named_pools.get(name)
        if current is not None and current[1] == local.name:
            current[0].resize(size)
            current[0].prewarm(local)
            return
        if current is not None:
            await self.remove_pool(name)
        keeper = pool.WarmPool(size, [local.name], self._make_warm, self._teardown,
                               parallel=self._refills_at_once(), gate=self.starts)
        self.named_pools[name] = (keeper, local.name)
        keeper.prewarm(local)

    async def remove_pool(self, name: str) -> None:
        entry = self.named_pools.pop(name, None)
        if entry is None:
            return
        for cid in await entry[0].stop():
            with contextlib.suppress(Exception):
                await self._teardown(cid)

    def pool_ready(self, name: str) -> int:
        entry = self.named_pools.get(name)
        return entry[0].ready_count(entry[1]) if entry is not None else 0

    # -- snapshots ----------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> None:
        """Freeze the sandbox (cgroup freezer, through runc), copy its upper dir, thaw it.

        The copy is a new layer over the lower dirs the sandbox runs on (see
        ``snapshots.py``); a paused sandbox is copied as it is and stays paused.
        """
        _check_id(sandbox_id)
        async with self._locks[sandbox_id]:
            info = await self.inspect(sandbox_id)
            if info.state not in (ContainerState.RUNNING, ContainerState.PAUSED):
                self._require_running(info)
            cid = self.container_id(sandbox_id)
            base = self._running_image(cid)
            freeze = info.state == ContainerState.RUNNING
            p = SandboxPaths.of(self.data_dir, cid)
            if freeze:
                # Recorded first: a server killed during the copy leaves the container frozen,
                # and the next start thaws it (``_thaw_interrupted_snapshots``).
                p.snapshot_freeze.touch()
                await self.runc.pause(cid)
            try:
                await asyncio.to_thread(self.snapshots.commit, snapshot_id, p.upper, base,
                                        self.snapshots.parent_of(base))
            finally:
                if freeze:
                    await self.runc.resume(cid)
                    p.snapshot_freeze.unlink(missing_ok=True)

    def _running_image(self, container_id: str) -> Image:
        """The image a container runs (its lower dirs and config), from its bundle."""
        p = SandboxPaths.of(self.data_dir, container_id)
        try:
            meta = json.loads((p.root / "image.json").read_text())
        except FileNotFoundError:
            raise RuntimeFailure(f"sandbox {container_id} was started by an older sandlot that "
                                 "did not record its layers; it cannot be snapshotted") from None
        return Image(name=meta["name"], id=meta["id"],
                     lower_dirs=[Path(d) for d in meta["lower_dirs"]],
                     config=ImageConfig(**meta["config"]))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        pools = sorted(n for n, (_, image) in self.named_pools.items()
                       if image == f"snapshot/{snapshot_id}")
        if pools:
            raise Conflict(f"snapshot {snapshot_id} is in use by pool {', '.join(pools)}; "
                           "delete the pool first", code="SNAPSHOT::DELETE_CONFLICT")
        # A snapshot in use is refused before its warm pool is touched; otherwise its warm
        # containers (which stand on its layer) go first, and none starts meanwhile.
        await asyncio.to_thread(self.snapshots.refuse_if_used, snapshot_id,
                                await self.list_ids())
        async with self.snapshot_pools.draining(snapshot_id):
            live = await self.list_ids()
            await asyncio.to_thread(self.snapshots.delete, snapshot_id, live)

    # -- state --------------------------------------------------------------------------

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        _check_id(sandbox_id)
        cid = self.container_id(sandbox_id)
        if self.gvisor and hibernate.settling(cid) and hibernate.is_hibernated(
                self.paths(sandbox_id)):
            # Just hibernated: ``runsc state`` would wait out the deferred delete's lock.
            return ContainerInfo(sandbox_id, ContainerState.PAUSED, reason=hibernate.REASON)
        st = await self.runc.state(cid)
        state = (_STATES.get(st.get("status", ""), ContainerState.STOPPED) if st is not None
                 else ContainerState.MISSING)
        pid = st.get("pid") or None if st is not None else None
        # checkpointed: its container may still be there (hibernate deletes it after
        # answering)
        if self.gvisor and hibernate.is_hibernated_state(
                self.paths(sandbox_id),
                state in (ContainerState.MISSING, ContainerState.STOPPED), pid):
            return ContainerInfo(sandbox_id, ContainerState.PAUSED, reason=hibernate.REASON)
        if st is None:
            return ContainerInfo(sandbox_id, ContainerState.MISSING)
        return ContainerInfo(sandbox_id, state, pid=pid if state != ContainerState.STOPPED
                             else None)

    async def pause(self, sandbox_id: str) -> None:
        # Under the sandbox's lock, as a snapshot's capture is: during the copy the sandbox
        # is frozen by the capture, so a pause then would find it paused, do nothing, and be
        # undone by the capture's thaw. It waits for the capture instead.
        async with self._locks[sandbox_id]:
            info = await self.inspect(sandbox_id)
            if info.state == ContainerState.PAUSED:
                return
            self._require_running(info)
            cid = self.container_id(sandbox_id)
            if self.pause_modes.recorded(self.paths(sandbox_id)) == "hibernate":
                await hibernate.hibernate(self.runc, cid, self.paths(sandbox_id), info.pid)
                return
            await self.runc.pause(cid)

    async def resume(self, sandbox_id: str) -> None:
        # Under the lock too: a resume during a capture would thaw the sandbox mid-copy.
        async with self._locks[sandbox_id]:
            info = await self.inspect(sandbox_id)
            if info.state == ContainerState.RUNNING:
                return
            if info.state != ContainerState.PAUSED:
                self._require_running(info)
            cid = self.container_id(sandbox_id)
            if info.reason == hibernate.REASON:
                await runsc.address_sandbox_link(netns_name(cid))
                await hibernate.restore(self.runc, cid, self.paths(sandbox_id),
                                        self._execd_connect(cid))
                return
            await self.runc.resume(cid)

    @staticmethod
    def _require_running(info: ContainerInfo) -> None:
        if info.state == ContainerState.MISSING:
            raise NotFound(f"sandbox {info.sandbox_id} not found")
        if info.state != ContainerState.RUNNING:
            raise Conflict(f"sandbox {info.sandbox_id} is {info.state.value}, not running")

    async def list_ids(self) -> set[str]:
        """Containers in runc's state dir plus sandbox folders (leftovers of a crash).

        Warm containers are not sandboxes: unclaimed ones are left out, claimed ones are
        reported under their sandbox id (even if the container is gone, so that the
        server's reconciliation deletes the claim too).
        """
        ids = {i for i in self._container_ids() if not pool.is_pool_id(i)}
        return ids | set(self.claims.items())

    def _container_ids(self) -> set[str]:
        ids = self.runc.ids()
        sb = self.data_dir / "sandboxes"
        if sb.is_dir():
            ids |= {d.name for d in sb.iterdir() if d.is_dir() and not removal.is_trash(d.name)}
        return ids

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        _check_id(sandbox_id)
        return await self._connect_container(self.container_id(sandbox_id), port)

    async def _connect_container(self, container_id: str, port: int) -> socket.socket:
        if not 0 < port < 65536:
            raise InvalidRequest(f"port {port} is out of range (1-65535)")
        name = netns_name(container_id)
        if self.host_network:  # the server's own namespace
            root = SandboxPaths.of(self.data_dir, container_id).root
            if not root.is_dir():
                raise NotFound(f"sandbox {container_id} not found")
            if port == self.execd_port:  # execd's port, as clients know it: its own one
                port = hostmode.execd_port(root) or port
            return await _connect_loopback(port)
        if self.gvisor:  # sockets live in gVisor's netstack, reached over the access veth
            ns, host = netns.netns_path(runsc.access_netns_name(name)), runsc.GVISOR_ADDR
        else:
            ns, host = netns.netns_path(name), "127.0.0.1"
        if not ns.exists():
            raise NotFound(f"sandbox {container_id} not found")
        return await self._connector.connect(ns, port, host)

    @property
    def _hands_off(self) -> bool:
        """Whether execd takes its endpoint's connections whole (``oci/handoff.py``): runc
        sandboxes in a network namespace of their own (gVisor's sockets are in its netstack;
        host mode shares the server's namespace, where the one address would collide)."""
        return not self.gvisor and not self.host_network

    def hand_off(self, sandbox_id: str, port: int, conn: socket.socket) -> bool:
        if port != self.execd_port or not self._hands_off:
            return False
        _check_id(sandbox_id)
        handoff.hand_off(netns.netns_path(netns_name(self.container_id(sandbox_id))), conn)
        return True

    def _execd_connect(self, container_id: str) -> execd_client.Connect:
        return lambda: self._connect_container(container_id, self.execd_port)

    async def usage(self, sandbox_id: str) -> ResourceUsage | None:
        _check_id(sandbox_id)
        path = cgroups.cgroups_path(self.container_id(sandbox_id))
        return await asyncio.to_thread(cgroupstats.usage_of_path, path)

    async def usage_many(self, sandbox_ids: Sequence[str]) -> dict[str, ResourceUsage | None]:
        """All in one worker-thread hop: a hop per sandbox woke the event loop once each,
        which in an idle server with 60 sandboxes was most of its CPU (measured)."""
        paths = {sid: cgroups.cgroups_path(self.container_id(sid)) for sid in sandbox_ids
                 if _ID_RE.match(sid)}
        found = await asyncio.to_thread(cgroupstats.usage_of_paths, paths)
        return {sid: found.get(sid) for sid in sandbox_ids}

    async def init_log(self, sandbox_id: str, max_bytes: int) -> tuple[bytes, bool] | None:
        _check_id(sandbox_id)
        # runc's stdio file in the sandbox's host folder: written through a descriptor the
        # container holds, never a path the sandbox can change.
        return await asyncio.to_thread(tail_file, self.paths(sandbox_id).container_log,
                                       max_bytes)

    def warm_pools(self) -> dict[str, WarmPoolStats]:
        found = {"": self.pool.stats()}
        found.update({name: keeper.stats() for name, (keeper, _) in self.named_pools.items()})
        found.update(self.snapshot_pools.stats())
        return found

    def diagnostic_ids(self, sandbox_id: str) -> dict[str, str]:
        cid = self.container_id(sandbox_id)
        return {"containerId": cid, "ociRuntime": self.binary.isolation,
                "cgroupsPath": cgroups.cgroups_path(cid),
                "netns": "host" if self.host_network else netns_name(cid)}

    async def close(self) -> None:
        """Stop refilling and delete the unclaimed warm containers (a start re-creates them)."""
        await self.drain_pool()
        await self._removals.wait()
        if self.zygote is not None:
            await self.zygote.close()
        self._connector.close()
        if self.network is not None:
            await self.network.close()
        if self._pool_lock_fd is not None:
            os.close(self._pool_lock_fd)  # releases the pool lock
            self._pool_lock_fd = None
        # This data dir's folder of rootfs mount points, once no sandbox is left in it (each
        # start makes it again): data dirs come and go (tests, tools), their folders with them.
        with contextlib.suppress(OSError):
            self._roots_dir.rmdir()

    # -- warm pool ----------------------------------------------------------------------

    async def prewarm(self, image: ImageRef) -> None:
        """Start keeping warm containers of ``image`` (no-op unless it is a pooled image
        stored here: prewarming never pulls).

        Returns at once; the pool fills in the background (``_refills_at_once``).
        """
        local = self.images.get(image.reference)
        if local is None:
            log.info("warm pool: image %s is not stored here; not prewarming it",
                     image.reference)
            return
        self.pool.prewarm(local)

    async def drain_pool(self) -> None:
        await self.leftovers.wait()  # a crashed server's, still being removed
        for name in list(self.named_pools):
            await self.remove_pool(name)
        await self.snapshot_pools.stop()
        await leftovers.teardown_all(await self.pool.stop(), self._teardown)
        # Anything of ours the bookkeeping missed; only ours: another process may be serving
        # this data dir (tools, tests), and its warm containers are not ours to remove.
        await self._sweep_pool(only=set(self._made_warm))

    def _stale_warm(self) -> set[str]:
        """Warm containers nobody claimed (left by a crash or a kill -9)."""
        claimed = set(self.claims.items().values())
        return {cid for cid in self._container_ids()
                if pool.is_pool_id(cid) and cid not in claimed}

    async def _sweep_pool(self, only: set[str]) -> None:
        """Delete the unclaimed warm containers among ``only``, a few at a time."""
        await leftovers.teardown_all(self._stale_warm() & only, self._teardown)

    async def _make_warm(self, image: Image) -> pool.Warm:
        cid = pool.new_pool_id()
        self._made_warm.add(cid)
        token = secrets.token_urlsafe(24)
        spec = SandboxSpec(sandbox_id=cid, image=ImageRef(image.name), entrypoint=[],
                           pids_limit=self.pids_limit, execd_token=token,
                           disk_bytes=self.default_disk_bytes)
        p = SandboxPaths.of(self.data_dir, cid)
        try:  # in a background start slot, which the pool holds (pool.WarmPool)
            await self._create(spec, image, p, pooled=True)
            await execd_client.wait_ready(self._execd_connect(cid), None, pool.READY_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._teardown(cid)
            raise
        return pool.Warm(cid, token, image.id)

    async def _claim(self, spec: SandboxSpec, image: Image, warm: pool.Warm) -> bool:
        """Give ``warm`` to ``spec``'s sandbox; False (warm container deleted) if that fails."""
        cid = warm.container_id
        p = SandboxPaths.of(self.data_dir, cid)
        self.claims.add(spec.sandbox_id, cid)  # first: a crash from here on leaves a sandbox
        try:
            # gVisor keeps its hostname inside the sentry: not settable from the host.
            pid = None if self.gvisor else claimops.init_pid(self.runc.root, cid)
            host_side = asyncio.to_thread(self._claim_host_side, spec, cid, pid, p)
            if self.network is not None and spec.network_policy is not None:
                # The policy's nft batch and the limits/hostname are independent: side by
                # side (both before execd's claim starts the workload, so the policy holds
                # from its first packet).
                results = await asyncio.gather(
                    host_side, self.network.set_policy(cid, spec.network_policy),
                    return_exceptions=True)
                for res in results:
                    if isinstance(res, BaseException):
                        raise res
            else:
                await host_side
            await execd_client.claim(self._execd_connect(cid), warm.token,
                                     env=self._claim_env(spec, image), token=spec.execd_token,
                                     entrypoint=list(spec.entrypoint))
        except Exception:  # noqa: BLE001 - fall back to a cold create
            log.warning("claiming warm container %s for %s failed", cid, spec.sandbox_id,
                        exc_info=True)
            with contextlib.suppress(Exception):
                await self._teardown(cid)
            self.claims.remove(spec.sandbox_id)
            return False
        except BaseException:
            with contextlib.suppress(Exception):
                await self._teardown(cid)
            self.claims.remove(spec.sandbox_id)
            raise
        return True

    def _claim_host_side(
        self, spec: SandboxSpec, cid: str, pid: int | None, p: SandboxPaths
    ) -> None:
        """Limits, hostname and /etc/host{name,s}: one worker-thread hop."""
        pids = self._host_pids(spec)
        claimops.apply_limits(cid, cpu_cores=spec.cpu_cores, memory_bytes=spec.memory_bytes,
                              pids=pids, swap_limit=self._swap)
        if self.gvisor:  # a restore re-creates the cgroups from config.json: keep it in step
            claimops.record_limits(p.config_json, cpu_cores=spec.cpu_cores,
                                   memory_bytes=spec.memory_bytes, pids=pids,
                                   swap_limit=self._swap)
        host = ocispec.hostname(spec)
        if pid is not None:
            claimops.set_hostname(pid, host)
        # Written in place: they are bind-mounted files, a new inode would not be seen.
        (p.etc / "hostname").write_text(host + "\n")
        (p.etc / "hosts").write_text(
            f"127.0.0.1\tlocalhost {host}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )

    def _host_pids(self, spec: SandboxSpec) -> int:
        limit = min(spec.pids_limit, self.pids_limit)
        return runsc.host_pids_limit(limit) if self.gvisor else limit

    def _claim_env(self, spec: SandboxSpec, image: Image) -> dict[str, str]:
        """What a cold create would give the workload: defaults, image env, spec env."""
        env = {"PATH": ocispec.DEFAULT_PATH, "HOME": "/root", "HOSTNAME": ocispec.hostname(spec)}
        env.update(ocispec.env_dict(image.config.env))
        env.update(spec.env)
        for private in (*self.bundle.env(), "SANDLOT_EXECD_TOKEN", "SANDLOT_EXECD_PRIVATE_ENV"):
            env.pop(private, None)
        return env
