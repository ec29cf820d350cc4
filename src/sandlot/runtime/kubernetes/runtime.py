"""``KubernetesRuntime``: each sandbox is a Pod of an existing cluster
(``[runtime] type = "kubernetes"``).

Kubernetes places, runs and accounts for the Pods; sandlot keeps its own lifecycle rules and
store as with every backend. Pods are named ``sandlot-<sandbox id>`` in the configured
namespace and labelled with the sandbox id and this sandlot's owner id, so a restarted server
re-adopts them from the cluster alone and never touches anyone else's Pods. One watch
(``watcher``) follows them: creates wait on it, and Pods deleted, evicted or failed behind
sandlot's back are reported from it with the Pod status's reason.

execd comes from sandlot's bundle image through an init container (``bundle_image``), or
from a verified per-node cache entry (``node_cache``, ``[kubernetes] execd_delivery``); the
server reaches execd and any other port through ``connect``: the Pod's IP where Pod
addresses route (``connect_mode = "pod-ip"``), else the API server's port-forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import defaultdict
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from sandlot import datadir
from sandlot.config import Config
from sandlot.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    RuntimeFailure,
    Unsupported,
)
from sandlot.net.policy import coerce
from sandlot.runtime import bundle_prune, execd_client
from sandlot.runtime.base import (
    ContainerInfo,
    ContainerState,
    CreateResult,
    ImageRef,
    Progress,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
    StateListener,
    VolumeSpec,
    WarmPoolStats,
)
from sandlot.runtime.execd_bundle import MOUNT_POINT, ensure_bundle
from sandlot.runtime.kubernetes import bundle_image, netpolicy, podstatus
from sandlot.runtime.kubernetes.apierror import explain
from sandlot.runtime.kubernetes.egress import PodEgress
from sandlot.runtime.kubernetes.node_cache import NodeCache
from sandlot.runtime.kubernetes.pod import (
    ANNOTATION_EXTENSIONS,
    ANNOTATION_METADATA,
    ANNOTATION_SANDBOX,
    LABEL_OWNER,
    LABEL_SANDBOX,
    LABEL_WARM,
    NAME_PREFIX,
    PodPlan,
    check_id,
    pod_name,
)
from sandlot.runtime.kubernetes.portforward import PortForwarder
from sandlot.runtime.kubernetes.warm import WarmKeeper, WarmPod, warm_labels_patch
from sandlot.runtime.kubernetes.watcher import PodWatch
from sandlot.server.quantity import parse_cpu, parse_ephemeral_storage, parse_memory

log = logging.getLogger(__name__)
# Keeper keys of the server's warm pool: one per image ("" + image; pool names have no ":").
SERVER_POOL = ":"
EXECD_START_WAIT = 10.0  # seconds a just-started Pod's execd may refuse connections



async def api_client(cfg: Config) -> client.ApiClient:
    """An API client from ``kubeconfig_path``, else ``$KUBECONFIG``, else the in-cluster
    service account; ``RuntimeFailure`` says which was tried."""
    conf = client.Configuration()
    path = cfg.kubernetes.kubeconfig_path or os.environ.get("KUBECONFIG")
    try:
        if path:
            await config.load_kube_config(config_file=path, client_configuration=conf)
        else:
            config.load_incluster_config(client_configuration=conf)
    except (ConfigException, OSError) as exc:
        where = f"kubeconfig {path}" if path else \
            "the in-cluster service account (no [kubernetes] kubeconfig_path, no $KUBECONFIG)"
        raise RuntimeFailure(f"cannot configure a Kubernetes client from {where}: {exc}") \
            from exc
    return client.ApiClient(conf)


class KubernetesRuntime(Runtime):
    """The Kubernetes backend (see module docstring)."""

    name = "kubernetes"

    def __init__(self, api: client.ApiClient, plan: PodPlan, full: Config | None = None) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.plan = plan
        self.cfg = plan.cfg
        self.namespace = plan.cfg.namespace
        self.capabilities = RuntimeCapabilities(
            pause=False, volume_kinds=frozenset({"host", "pvc"}), disk_limit=True,
            resource_requests=True, pools=True,
            # always: check_network_policy says why a policy cannot be enforced here
            network_policy=True,
            isolation=f"kubernetes/{plan.runtime_class or 'default RuntimeClass'}",
        )
        self.pods = PodWatch(self.core, self.namespace, f"{LABEL_OWNER}={plan.owner}")
        self.pods.listeners.append(self._pod_changed)
        self._forwarder = PortForwarder(api, self.namespace) \
            if self.cfg.connect_mode == "port-forward" else None
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._ips: dict[str, str] = {}
        self._starting_execd: set[str] = set()  # Pods started, execd not reached yet
        self._deleting: set[str] = set()
        self._reported: set[str] = set()
        self._listener: StateListener | None = None
        self._reports: set[asyncio.Task[None]] = set()
        # sandbox id -> Pod name where they differ (a claimed warm Pod), from the Pods' labels
        self._claimed: dict[str, str] = {}
        # warm Pods by pool (SERVER_POOL + image: the server's warm pool, else a /v1/pools
        # pool's name)
        self.keepers: dict[str, WarmKeeper] = {}
        self.full_cfg = full
        # node-cache: nodes where a fill init container of this bundle succeeded
        self.node_cache = NodeCache(self.core, plan) if plan.node_cache else None
        # egress policies: the DNS filter and NetworkPolicies ([kubernetes] dns_filter_*)
        self.egress: PodEgress | None = None
        if full is not None and netpolicy.filter_configured(full):
            self.egress = PodEgress(full, api, plan.owner, plan.sandbox_labels,
                                    self._sandbox_at)

    @classmethod
    async def open(cls, cfg: Config) -> KubernetesRuntime:
        """Reach the API server, check the namespace and RuntimeClass, build the bundle."""
        kcfg = cfg.kubernetes
        api = await api_client(cfg)
        rt: KubernetesRuntime | None = None
        try:
            core = client.CoreV1Api(api)
            try:
                await core.list_namespaced_pod(kcfg.namespace, limit=1)
            except ApiException as exc:
                raise RuntimeFailure(f"cannot list Pods in namespace {kcfg.namespace!r} of "
                                     f"{api.configuration.host}: {explain(exc)}") from exc
            runtime_class = await _runtime_class(api, cfg)
            datadir.create(cfg.data_dir)
            # Pods get the bundle as an image, not from this cache; only the sandboxes of an
            # OCI server this data dir served before could name one.
            bundle = await asyncio.to_thread(
                ensure_bundle, cfg.data_dir / "execd-bundle",
                lambda: bundle_prune.named_in_oci_configs(cfg.data_dir, MOUNT_POINT))
            image = kcfg.execd_bundle_image or bundle_image.image_name(bundle)
            plan = PodPlan(cfg=kcfg, bundle=bundle, bundle_image=image,
                           owner=kcfg.owner or datadir.owner_id(cfg.data_dir, "kubernetes-owner"),
                           execd_port=cfg.execd.port, runtime_class=runtime_class,
                           warm_pool_images=tuple(cfg.runtime.warm_pool_images),
                           default_limits=tuple(sorted(cfg.runtime.default_resources.items())),
                           default_disk=cfg.runtime.default_ephemeral_storage,
                           cache_name=bundle_image.cache_name(image)
                           if kcfg.execd_delivery == "node-cache" else None)
            rt = cls(api, plan, cfg)
            await rt.pods.start()
            for pod in list(rt.pods.pods.values()):
                rt._note(pod)
            if rt.egress is not None:
                await rt.egress.start()
            await rt._sweep_warm()  # a dead server's warm Pods: their pool tokens are lost
            for image in rt.plan.warm_pool_images:  # the server's warm pool
                await rt.prewarm(ImageRef(image))
        except BaseException:
            if rt is not None:
                await rt.pods.close()
                if rt.egress is not None:
                    await rt.egress.close()
            await api.close()
            raise
        log.info("kubernetes API %s, namespace %s, execd bundle image %s, connect via %s",
                 api.configuration.host, kcfg.namespace, plan.bundle_image, kcfg.connect_mode)
        return rt

    # -- create -------------------------------------------------------------------------

    async def check_volumes(self, volumes: list[VolumeSpec]) -> None:
        for vol in volumes:
            if vol.kind == "pvc" and not vol.options.get("createIfNotExists", False):
                try:
                    await self.core.read_namespaced_persistent_volume_claim(
                        vol.source, self.namespace)
                except ApiException as exc:
                    if exc.status == 404:
                        raise InvalidRequest(
                            f"volume {vol.name!r}: no PersistentVolumeClaim {vol.source!r} in "
                            f"namespace {self.namespace}") from exc
                    raise RuntimeFailure(f"cannot check claim {vol.source}: {explain(exc)}") \
                        from exc

    async def create(self, spec: SandboxSpec, progress: Progress | None = None) -> CreateResult:
        check_id(spec.sandbox_id)
        if spec.network_policy is not None:
            self.check_network_policy(spec.network_policy)
        if spec.snapshot_id is not None:
            raise Unsupported("the kubernetes runtime has no snapshots")
        name = pod_name(spec.sandbox_id)
        async with self._locks[spec.sandbox_id]:
            if name in self.pods.pods or spec.sandbox_id in self._claimed:
                raise Conflict(f"sandbox {spec.sandbox_id} already exists")
            warm = self._take_warm(spec)
            if warm is not None and await self._claim(spec, warm):
                return CreateResult(execd_ready=True)  # its execd just answered the claim
            if progress is not None:
                await progress("Starting", f"creating Pod {name} in namespace {self.namespace}")
            try:
                if self.egress is not None:
                    await self.egress.prepare(
                        spec.sandbox_id,
                        None if spec.network_policy is None else coerce(spec.network_policy))
                await self._start(spec)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._remove(spec.sandbox_id))
                if isinstance(exc, ApiException):
                    hint = ""
                    if self.plan.node_cache and "hostPath" in str(exc.body or ""):
                        hint = ('; [kubernetes] execd_delivery = "node-cache" mounts a hostPath '
                                'volume, which this namespace\'s policy refuses: use "copy"')
                    raise RuntimeFailure(f"the cluster refused sandbox {spec.sandbox_id}: "
                                         f"{explain(exc)}{hint}") from exc
                raise
        return CreateResult(execd_ready=False)

    async def _start(self, spec: SandboxSpec, pooled: bool = False) -> None:
        secrets = []
        if spec.execd_token:
            secrets.append(self.plan.token_secret(spec))
        if spec.image.auth is not None:
            secrets.append(self.plan.pull_secret(spec))
        for secret in secrets:
            body: Any = secret  # the client sends plain manifests as they are
            await self.core.create_namespaced_secret(self.namespace, body)
        cached_on = await self.node_cache.bound_nodes() if self.node_cache is not None else None
        manifest: Any = self.plan.pod(spec, pull_secret=spec.image.auth is not None,
                                      pooled=pooled, cached_on=cached_on)
        if self.egress is not None:
            fields, annotations = self.egress.pod_fields(
                None if spec.network_policy is None else coerce(spec.network_policy))
            manifest["spec"].update(fields)
            manifest["metadata"]["annotations"].update(annotations)
        created = await self.core.create_namespaced_pod(self.namespace, manifest)
        owned = asyncio.gather(
            *(self._own(s["metadata"]["name"], created) for s in secrets),
            *([self.egress.own(spec.sandbox_id, created)] if self.egress is not None else []))
        try:
            pod = await self._wait_running(spec, created.metadata.name)
        except BaseException:
            if cached_on is not None and self.node_cache is not None:
                self.node_cache.forget(self.pods.pods.get(created.metadata.name))
            raise
        finally:
            await owned
        self._ips[spec.sandbox_id] = pod.status.pod_ip
        if not pooled:
            self._starting_execd.add(spec.sandbox_id)
        if self.egress is not None and not pooled:
            self.egress.bind_ip(spec.sandbox_id, pod.status.pod_ip)

    async def _own(self, secret: str, pod: Any) -> None:
        """Make the Pod the Secret's owner: the cluster deletes it with the Pod."""
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
               "uid": pod.metadata.uid}
        await self.core.patch_namespaced_secret(
            secret, self.namespace, {"metadata": {"ownerReferences": [ref]}})

    async def _wait_running(self, spec: SandboxSpec, name: str) -> Any:
        timeout = self.cfg.sandbox_create_timeout_seconds
        try:
            pod = await self.pods.wait_for(
                name, lambda p: p is not None and podstatus.settled(p), timeout)
        except TimeoutError:
            pod = self.pods.pods.get(name)
            raise RuntimeFailure(
                f"Pod {name} did not run within {timeout}s "
                f"({podstatus.describe(pod) if pod is not None else 'never seen'})"
            ) from None
        error = podstatus.start_error(pod, spec.image.reference, self.plan.bundle_image)
        if error is not None:
            raise error
        return pod

    # -- delete -------------------------------------------------------------------------

    async def delete(self, sandbox_id: str) -> None:
        check_id(sandbox_id)
        async with self._locks[sandbox_id]:
            await self._remove(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def _remove(self, sandbox_id: str, wait: bool = False) -> None:
        """Delete the Pod and its Secrets; with ``wait``, until the Pod is gone.

        A delete does not wait: the kubelet stops the Pod within its grace period, and a
        terminating Pod is no longer one of the runtime's sandboxes (``list_ids``).
        """
        name = self._name(sandbox_id)
        self._deleting.add(sandbox_id)
        self._ips.pop(sandbox_id, None)
        self._starting_execd.discard(sandbox_id)
        try:
            await self._delete_pod(name, sandbox_id)
            if self.egress is not None:
                await self.egress.remove(sandbox_id, name)
            if wait:
                try:
                    await self.pods.wait_for(
                        name, lambda p: p is None,
                        self.cfg.termination_grace_period_seconds + 60)
                except TimeoutError:
                    log.warning("Pod %s is still terminating", name)
        finally:
            self._deleting.discard(sandbox_id)
            self._reported.discard(sandbox_id)
            self._claimed.pop(sandbox_id, None)

    async def _delete_pod(self, name: str, sandbox_id: str | None = None) -> None:
        """Delete Pod ``name`` and the Secrets made with it (its own id's, and
        ``sandbox_id``'s when it was a claimed warm Pod)."""
        try:
            await self.core.delete_namespaced_pod(
                name, self.namespace,
                grace_period_seconds=self.cfg.termination_grace_period_seconds)
        except ApiException as exc:
            if exc.status != 404:
                raise RuntimeFailure(f"cannot delete Pod {name}: {explain(exc)}") from exc
        ids = {name.removeprefix(NAME_PREFIX), *([sandbox_id] if sandbox_id else [])}
        for owner_id in sorted(ids):
            try:
                await self.core.delete_collection_namespaced_secret(
                    self.namespace,
                    label_selector=f"{LABEL_OWNER}={self.plan.owner},{LABEL_SANDBOX}={owner_id}")
            except ApiException as exc:
                raise RuntimeFailure(f"cannot delete the Secrets of {name}: {explain(exc)}") \
                    from exc

    # -- state --------------------------------------------------------------------------

    async def _read(self, sandbox_id: str) -> Any | None:
        try:
            return await self.core.read_namespaced_pod(self._name(sandbox_id), self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeFailure(f"cannot read Pod of {sandbox_id}: {explain(exc)}") from exc

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        check_id(sandbox_id)
        pod = await self._read(sandbox_id)
        labels = {} if pod is None else pod.metadata.labels or {}
        if (labels.get(LABEL_OWNER) != self.plan.owner
                or labels.get(LABEL_SANDBOX) != sandbox_id or LABEL_WARM in labels):
            return ContainerInfo(sandbox_id, ContainerState.MISSING,
                                 reason=f"the Pod is gone from namespace {self.namespace}")
        return podstatus.info(sandbox_id, pod)

    # -- egress (egress.py) -----------------------------------------------------------------

    def check_network_policy(self, policy: object) -> None:
        if self.full_cfg is None:
            raise InvalidRequest("networkPolicy is not supported by this kubernetes runtime")
        reason = netpolicy.refusal(self.full_cfg, coerce(policy))
        if reason is not None:
            raise InvalidRequest(reason)

    async def set_network_policy(self, sandbox_id: str, policy: object) -> None:
        """Enforce ``policy`` for a running sandbox at once (its Pod is not restarted)."""
        check_id(sandbox_id)
        if self.egress is None:
            self.check_network_policy(policy)  # says what to configure
            raise Unsupported("the kubernetes runtime has no DNS filter configured")
        pod = self.pods.pods.get(self._name(sandbox_id)) or await self._read(sandbox_id)
        if pod is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        await self.egress.set_policy(sandbox_id, pod, coerce(policy))

    async def _sandbox_at(self, ip: str) -> str | None:
        """The sandbox whose Pod has address ``ip``, asked of the API server (the watch
        may not have shown a just-started Pod's address yet)."""
        try:
            found = await self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_OWNER}={self.plan.owner}",
                field_selector=f"status.podIP={ip}")
        except ApiException as exc:
            log.warning("dns filter: cannot look up Pod IP %s: %s", ip, explain(exc))
            return None
        for pod in found.items:
            labels = pod.metadata.labels or {}
            if LABEL_WARM not in labels and pod.metadata.deletion_timestamp is None:
                return labels.get(LABEL_SANDBOX)
        return None

    async def pause(self, sandbox_id: str) -> None:
        raise Unsupported("pause is not supported by the kubernetes runtime: Kubernetes has "
                          "no way to freeze a Pod's processes and keep its memory")

    async def resume(self, sandbox_id: str) -> None:
        raise Unsupported("resume is not supported by the kubernetes runtime (no pause)")

    async def list_ids(self) -> set[str]:
        """This sandlot's sandboxes in the namespace, found by their labels."""
        return {
            labels[LABEL_SANDBOX]
            for pod in list(self.pods.pods.values())
            if LABEL_SANDBOX in (labels := pod.metadata.labels or {})
            and LABEL_WARM not in labels and pod.metadata.deletion_timestamp is None
        }

    # -- connect ------------------------------------------------------------------------

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        check_id(sandbox_id)
        if not 0 < port < 65536:
            raise InvalidRequest(f"port {port} is out of range (1-65535)")
        await self._until_started(sandbox_id)
        if self._forwarder is not None:
            await self._require_running(sandbox_id)
            return await self._forwarder.connect(self._name(sandbox_id), port)
        ip = self._ips.get(sandbox_id) or await self._pod_ip(sandbox_id)
        if port != self.plan.execd_port or sandbox_id not in self._starting_execd:
            return await self._connect_ip(ip, port)
        # execd of a Pod that just started: refused until it listens (well under a second)
        deadline = asyncio.get_running_loop().time() + EXECD_START_WAIT
        while True:
            try:
                sock = await self._connect_ip(ip, port)
            except ConnectionRefusedError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            self._starting_execd.discard(sandbox_id)
            return sock

    async def _until_started(self, sandbox_id: str) -> None:
        """Hold a connection to a sandbox whose Pod is being created until the Pod runs
        (or cannot): clients probe a Pending sandbox's execd (the SDK pings as soon as the
        create answers), and a refused probe makes them back off for seconds."""
        name = self._name(sandbox_id)
        lock = self._locks.get(sandbox_id)
        pod = self.pods.pods.get(name)
        if not (lock is not None and lock.locked()) and (pod is None or podstatus.settled(pod)):
            return
        with contextlib.suppress(TimeoutError):
            await self.pods.wait_for(
                name, lambda p: p is not None and podstatus.settled(p) or (
                    p is None and not (lock is not None and lock.locked())),
                self.cfg.sandbox_create_timeout_seconds)

    async def _connect_pod(self, name: str, ip: str | None, port: int) -> socket.socket:
        """A connection to a Pod by name (a warm Pod has no sandbox id yet)."""
        if self._forwarder is not None:
            return await self._forwarder.connect(name, port)
        if not ip:
            raise ConnectionRefusedError(f"Pod {name} has no address")
        return await self._connect_ip(ip, port)

    async def _connect_ip(self, ip: str, port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, (ip, port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _require_running(self, sandbox_id: str) -> Any:
        pod = self.pods.pods.get(self._name(sandbox_id)) or await self._read(sandbox_id)
        if pod is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if (pod.status.phase or "") != "Running" or not pod.status.pod_ip:
            raise ConnectionRefusedError(f"sandbox {sandbox_id}'s Pod is {pod.status.phase}")
        return pod

    async def _pod_ip(self, sandbox_id: str) -> str:
        pod = await self._require_running(sandbox_id)
        ip = str(pod.status.pod_ip)
        self._ips[sandbox_id] = ip
        return ip

    # -- warm Pods (warm.py) ---------------------------------------------------------------

    def _template(self, image: ImageRef, limits: dict[str, str]) -> SandboxSpec:
        """A warm Pod's spec: the shape a create of the pool gets (the server's defaults
        under the pool's limits); the keeper gives each its id and pool token."""
        merged = {**dict(self.plan.default_limits), **limits}
        disk = merged.get("ephemeral-storage") or self.plan.default_disk
        return SandboxSpec(
            sandbox_id="warm-template", image=image, entrypoint=[],
            cpu_cores=parse_cpu(merged["cpu"]) if "cpu" in merged else None,
            memory_bytes=parse_memory(merged["memory"]) if "memory" in merged else None,
            disk_bytes=parse_ephemeral_storage(disk) if disk else None)

    def _same_resources(self, a: SandboxSpec, b: SandboxSpec) -> bool:
        return self.plan.resources(a) == self.plan.resources(b)

    def _take_warm(self, spec: SandboxSpec) -> WarmPod | None:
        """A ready warm Pod for ``spec``: of the pool it names, else of the server's."""
        for pool in (spec.extensions.get("poolRef"), SERVER_POOL + spec.image.reference):
            keeper = self.keepers.get(pool) if pool else None
            if keeper is not None and keeper.fits(spec, self._same_resources):
                warm = keeper.take()
                if warm is not None:
                    return warm
        return None

    async def _claim(self, spec: SandboxSpec, warm: WarmPod) -> bool:
        """Make ``warm`` the sandbox's Pod; False (and the Pod deleted) if that fails."""
        annotations = {ANNOTATION_SANDBOX: spec.sandbox_id}
        if spec.metadata:
            annotations[ANNOTATION_METADATA] = json.dumps(spec.metadata, sort_keys=True)
        if spec.extensions:
            annotations[ANNOTATION_EXTENSIONS] = json.dumps(spec.extensions, sort_keys=True)
        self._claimed[spec.sandbox_id] = warm.name
        try:
            await self.core.patch_namespaced_pod(
                warm.name, self.namespace, warm_labels_patch(spec.sandbox_id, annotations))
            await execd_client.claim(
                lambda: self._connect_pod(warm.name, warm.ip, self.plan.execd_port),
                warm.token, env=dict(spec.env), token=spec.execd_token,
                entrypoint=list(spec.entrypoint))
        except Exception as exc:  # noqa: BLE001 - a cold start follows
            log.warning("claiming warm Pod %s for %s failed: %s", warm.name, spec.sandbox_id,
                        exc)
            self._claimed.pop(spec.sandbox_id, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._delete_pod(warm.name, spec.sandbox_id))
            return False
        if warm.ip:
            self._ips[spec.sandbox_id] = warm.ip
            if self.egress is not None:
                self.egress.bind_ip(spec.sandbox_id, warm.ip)
        return True

    async def _make_warm(self, template: SandboxSpec) -> WarmPod:
        name = pod_name(template.sandbox_id)
        assert template.execd_token is not None
        try:
            await self._start(template, pooled=True)
            ip = self._ips.pop(template.sandbox_id, None)
            await execd_client.wait_ready(
                lambda: self._connect_pod(name, ip, self.plan.execd_port),
                template.execd_token, self.cfg.sandbox_create_timeout_seconds)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._delete_pod(name))
            raise
        return WarmPod(name, template.execd_token, ip)

    async def _sweep_warm(self) -> None:
        """Delete every unclaimed warm Pod of this sandlot (and their Secrets)."""
        for pod in list(self.pods.pods.values()):
            if LABEL_WARM in (pod.metadata.labels or {}) and not any(
                    pod.metadata.name == w.name for k in self.keepers.values() for w in k.ready):
                with contextlib.suppress(Exception):
                    await self._delete_pod(pod.metadata.name)

    def _keep(self, pool: str, template: SandboxSpec, size: int) -> None:
        keeper = self.keepers.get(pool)
        if keeper is None or keeper.template != template:
            if keeper is not None:
                self._retire(pool)
            keeper = WarmKeeper(pool, template, size, self._make_warm, self._delete_pod)
            self.keepers[pool] = keeper
            keeper.fill()
        else:
            keeper.resize(size)

    def _retire(self, pool: str) -> None:
        keeper = self.keepers.pop(pool, None)
        if keeper is None:
            return

        async def stop() -> None:
            for name in await keeper.stop():
                with contextlib.suppress(Exception):
                    await self._delete_pod(name)

        task = asyncio.get_running_loop().create_task(stop())
        self._reports.add(task)
        task.add_done_callback(self._report_done)

    async def prewarm(self, image: ImageRef) -> None:
        """The server's warm pool: ``[kubernetes] warm_pool_size`` Pods of each of
        ``[runtime] warm_pool_images``, in the default shape."""
        if self.cfg.warm_pool_size > 0 and image.reference in self.plan.warm_pool_images:
            self._keep(SERVER_POOL + image.reference,
                       self._template(ImageRef(image.reference), {}), self.cfg.warm_pool_size)

    async def ensure_pool(self, name: str, image: ImageRef, size: int,
                          snapshot_id: str | None = None,
                          limits: dict[str, str] | None = None) -> None:
        if snapshot_id is not None:
            raise Unsupported("the kubernetes runtime has no snapshots: a pool of it starts "
                              "from an image")
        if not name:
            raise InvalidRequest("a pool needs a name")
        self._keep(name, self._template(ImageRef(image.reference), dict(limits or {})), size)

    async def remove_pool(self, name: str) -> None:
        keeper = self.keepers.pop(name, None)
        if keeper is not None:
            for pod in await keeper.stop():
                with contextlib.suppress(Exception):
                    await self._delete_pod(pod)

    def pool_ready(self, name: str) -> int:
        keeper = self.keepers.get(name)
        return len(keeper.ready) if keeper is not None else 0

    def warm_pools(self) -> dict[str, WarmPoolStats]:
        """By pool name; the server's warm pool (one keeper per image) as ""."""
        named = {p: k.stats() for p, k in self.keepers.items() if not p.startswith(SERVER_POOL)}
        server = [k.stats() for p, k in self.keepers.items() if p.startswith(SERVER_POOL)]
        if server:
            named[""] = WarmPoolStats(ready=sum(s.ready for s in server),
                                      claims=sum(s.claims for s in server),
                                      misses=sum(s.misses for s in server))
        return named

    # -- Pods changing behind the server's back -----------------------------------------

    def watch(self, changed: StateListener) -> None:
        self._listener = changed

    def _note(self, pod: Any, kind: str = "ADDED") -> None:
        """Remember which sandbox a claimed warm Pod serves (its labels say), and which
        sandbox is at which Pod IP (for the DNS filter)."""
        labels = pod.metadata.labels or {}
        sandbox_id = labels.get(LABEL_SANDBOX)
        if self.node_cache is not None and kind != "DELETED":
            self.node_cache.note(pod)
        if self.egress is not None:
            self.egress.note(kind, None if LABEL_WARM in labels else sandbox_id, pod)
        if (kind != "DELETED" and sandbox_id and LABEL_WARM not in labels
                and pod.metadata.name != pod_name(sandbox_id)):
            self._claimed[sandbox_id] = pod.metadata.name

    def _name(self, sandbox_id: str) -> str:
        return self._claimed.get(sandbox_id) or pod_name(sandbox_id)

    def _pod_changed(self, kind: str, pod: Any) -> None:
        self._note(pod, kind)
        labels = pod.metadata.labels or {}
        sandbox_id = labels.get(LABEL_SANDBOX)
        if LABEL_WARM in labels and (kind == "DELETED" or podstatus.info(
                sandbox_id or "", pod).state in (ContainerState.STOPPED, ContainerState.MISSING)):
            for keeper in self.keepers.values():  # a ready warm Pod gone behind our back
                keeper.forget(pod.metadata.name)
        if (sandbox_id is None or LABEL_WARM in labels or self._listener is None
                or sandbox_id in self._deleting or sandbox_id in self._reported
                or sandbox_id in self._locks and self._locks[sandbox_id].locked()):
            return
        if kind == "DELETED":
            info = ContainerInfo(sandbox_id, ContainerState.MISSING,
                                 reason=podstatus.gone_reason(pod))
        else:
            info = podstatus.info(sandbox_id, pod)
            if info.state not in (ContainerState.STOPPED, ContainerState.MISSING):
                return
        self._reported.add(sandbox_id)
        self._ips.pop(sandbox_id, None)
        listener = self._listener

        async def report() -> None:
            await listener(sandbox_id, info)

        task = asyncio.get_running_loop().create_task(report())
        self._reports.add(task)
        task.add_done_callback(self._report_done)

    def _report_done(self, task: asyncio.Task[None]) -> None:
        self._reports.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("reporting a Pod change failed", exc_info=task.exception())

    async def close(self) -> None:
        """Stop the watch; warm Pods are deleted (their pool tokens die with the server)."""
        for keeper in list(self.keepers.values()):
            await keeper.stop()
        self.keepers.clear()
        with contextlib.suppress(Exception):
            await self._sweep_warm()
        await self.pods.close()
        for task in list(self._reports):
            task.cancel()
        if self._forwarder is not None:
            await self._forwarder.close()
        if self.egress is not None:
            await self.egress.close()
        await self.api.close()


async def _runtime_class(api: client.ApiClient, cfg: Config) -> str | None:
    """The RuntimeClass ``[secure_runtime]`` asks for; refuses the start if the cluster has
    none of that name (never a silent fall-back to the cluster's default runtime)."""
    secure = cfg.secure_runtime
    if not secure.type:
        return None
    name = secure.k8s_runtime_class
    if not name:
        raise RuntimeFailure(f'[secure_runtime] type = "{secure.type}" on the kubernetes '
                             "runtime needs k8s_runtime_class, the RuntimeClass to use "
                             '(e.g. "gvisor")')
    try:
        await client.NodeV1Api(api).read_runtime_class(name)
    except ApiException as exc:
        raise RuntimeFailure(
            f"[secure_runtime] k8s_runtime_class = {name!r}: "
            + ("the cluster has no such RuntimeClass" if exc.status == 404 else explain(exc))
        ) from exc
    return name
