"""``KubernetesRuntime``: each sandbox is a Pod of an existing cluster
(``[runtime] type = "kubernetes"``).

Kubernetes places, runs and accounts for the Pods; sandlot keeps its own lifecycle rules and
store as with every backend. Pods are named ``sandlot-<sandbox id>`` in the configured
namespace and labelled with the sandbox id and this sandlot's owner id, so a restarted server
re-adopts them from the cluster alone and never touches anyone else's Pods. One watch
(``watcher``) follows them: creates wait on it, and Pods deleted, evicted or failed behind
sandlot's back are reported from it with the Pod status's reason.

execd comes from sandlot's bundle image through an init container (``bundle_image``); the
server reaches execd and any other port through ``connect``: the Pod's IP where Pod
addresses route (``connect_mode = "pod-ip"``), else the API server's port-forward.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from sandlot.runtime.base import (
    ContainerInfo,
    ContainerState,
    CreateResult,
    Progress,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
    StateListener,
    VolumeSpec,
)
from sandlot.runtime.execd_bundle import ensure_bundle
from sandlot.runtime.kubernetes import bundle_image, podstatus
from sandlot.runtime.kubernetes.pod import (
    LABEL_OWNER,
    LABEL_SANDBOX,
    LABEL_WARM,
    PodPlan,
    check_id,
    pod_name,
)
from sandlot.runtime.kubernetes.portforward import PortForwarder
from sandlot.runtime.kubernetes.watcher import PodWatch

log = logging.getLogger(__name__)



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


def explain(exc: ApiException) -> str:
    """The API server's message of an error (its Status body), else the HTTP reason."""
    import json

    with contextlib.suppress(Exception):
        message = json.loads(exc.body or "{}").get("message")
        if message:
            return str(message)
    return f"HTTP {exc.status} {exc.reason}"


class KubernetesRuntime(Runtime):
    """The Kubernetes backend (see module docstring)."""

    name = "kubernetes"

    def __init__(self, api: client.ApiClient, plan: PodPlan) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.plan = plan
        self.cfg = plan.cfg
        self.namespace = plan.cfg.namespace
        self.capabilities = RuntimeCapabilities(
            pause=False, volume_kinds=frozenset({"host", "pvc"}), disk_limit=True,
            isolation=f"kubernetes/{plan.runtime_class or 'default RuntimeClass'}",
        )
        self.pods = PodWatch(self.core, self.namespace, f"{LABEL_OWNER}={plan.owner}")
        self.pods.listeners.append(self._pod_changed)
        self._forwarder = PortForwarder(api, self.namespace) \
            if self.cfg.connect_mode == "port-forward" else None
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._ips: dict[str, str] = {}
        self._deleting: set[str] = set()
        self._reported: set[str] = set()
        self._listener: StateListener | None = None
        self._reports: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, cfg: Config) -> KubernetesRuntime:
        """Reach the API server, check the namespace and RuntimeClass, build the bundle."""
        kcfg = cfg.kubernetes
        api = await api_client(cfg)
        try:
            core = client.CoreV1Api(api)
            try:
                await core.list_namespaced_pod(kcfg.namespace, limit=1)
            except ApiException as exc:
                raise RuntimeFailure(f"cannot list Pods in namespace {kcfg.namespace!r} of "
                                     f"{api.configuration.host}: {explain(exc)}") from exc
            runtime_class = await _runtime_class(api, cfg)
            cfg.data_dir.mkdir(parents=True, exist_ok=True)
            bundle = await asyncio.to_thread(ensure_bundle, cfg.data_dir / "execd-bundle")
            plan = PodPlan(cfg=kcfg, bundle=bundle,
                           bundle_image=kcfg.execd_bundle_image or bundle_image.image_name(bundle),
                           owner=kcfg.owner or datadir.owner_id(cfg.data_dir, "kubernetes-owner"),
                           execd_port=cfg.execd.port, runtime_class=runtime_class)
            rt = cls(api, plan)
            await rt.pods.start()
        except BaseException:
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
            raise Unsupported("networkPolicy is not supported by the kubernetes runtime")
        if spec.snapshot_id is not None:
            raise Unsupported("the kubernetes runtime has no snapshots")
        name = pod_name(spec.sandbox_id)
        async with self._locks[spec.sandbox_id]:
            if name in self.pods.pods:
                raise Conflict(f"sandbox {spec.sandbox_id} already exists")
            if progress is not None:
                await progress("Starting", f"creating Pod {name} in namespace {self.namespace}")
            try:
                await self._start(spec)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._remove(spec.sandbox_id))
                if isinstance(exc, ApiException):
                    raise RuntimeFailure(f"the cluster refused sandbox {spec.sandbox_id}: "
                                         f"{explain(exc)}") from exc
                raise
        return CreateResult(execd_ready=False)

    async def _start(self, spec: SandboxSpec) -> None:
        secrets = []
        if spec.execd_token:
            secrets.append(self.plan.token_secret(spec))
        if spec.image.auth is not None:
            secrets.append(self.plan.pull_secret(spec))
        for secret in secrets:
            body: Any = secret  # the client sends plain manifests as they are
            await self.core.create_namespaced_secret(self.namespace, body)
        manifest: Any = self.plan.pod(spec, pull_secret=spec.image.auth is not None)
        created = await self.core.create_namespaced_pod(self.namespace, manifest)
        owned = asyncio.gather(*(self._own(s["metadata"]["name"], created) for s in secrets))
        try:
            pod = await self._wait_running(spec, created.metadata.name)
        finally:
            await owned
        self._ips[spec.sandbox_id] = pod.status.pod_ip

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
        name = pod_name(sandbox_id)
        self._deleting.add(sandbox_id)
        self._ips.pop(sandbox_id, None)
        try:
            try:
                await self.core.delete_namespaced_pod(
                    name, self.namespace,
                    grace_period_seconds=self.cfg.termination_grace_period_seconds)
            except ApiException as exc:
                if exc.status != 404:
                    raise RuntimeFailure(f"cannot delete Pod {name}: {explain(exc)}") from exc
            try:
                await self.core.delete_collection_namespaced_secret(
                    self.namespace,
                    label_selector=f"{LABEL_OWNER}={self.plan.owner},{LABEL_SANDBOX}={sandbox_id}")
            except ApiException as exc:
                raise RuntimeFailure(f"cannot delete the Secrets of {name}: {explain(exc)}") \
                    from exc
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

    # -- state --------------------------------------------------------------------------

    async def _read(self, sandbox_id: str) -> Any | None:
        try:
            return await self.core.read_namespaced_pod(pod_name(sandbox_id), self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeFailure(f"cannot read Pod of {sandbox_id}: {explain(exc)}") from exc

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        check_id(sandbox_id)
        pod = await self._read(sandbox_id)
        if pod is None or (pod.metadata.labels or {}).get(LABEL_OWNER) != self.plan.owner:
            return ContainerInfo(sandbox_id, ContainerState.MISSING,
                                 reason=f"the Pod is gone from namespace {self.namespace}")
        return podstatus.info(sandbox_id, pod)

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
        if self._forwarder is not None:
            await self._require_running(sandbox_id)
            return await self._forwarder.connect(pod_name(sandbox_id), port)
        ip = self._ips.get(sandbox_id) or await self._pod_ip(sandbox_id)
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
        pod = self.pods.pods.get(pod_name(sandbox_id)) or await self._read(sandbox_id)
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

    # -- Pods changing behind the server's back -----------------------------------------

    def watch(self, changed: StateListener) -> None:
        self._listener = changed

    def _pod_changed(self, kind: str, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        sandbox_id = labels.get(LABEL_SANDBOX)
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
        await self.pods.close()
        for task in list(self._reports):
            task.cancel()
        if self._forwarder is not None:
            await self._forwarder.close()
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



