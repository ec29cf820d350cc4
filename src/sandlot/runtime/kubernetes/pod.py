"""The Pod (and its Secrets) a sandbox runs as: execd as the container's command, limits,
hardening, labels.

One Pod per sandbox, named ``sandlot-<sandbox id>``. Its init container copies the execd
bundle from the bundle image (``bundle_image``) into an ``emptyDir``, or (``node-cache``)
fills/verifies the node's read-only hostPath entry, or there is none when the Pod is bound
to nodes known to hold the entry (``node_cache``); the sandbox container
runs the user's image with execd as its command and the user's entrypoint after ``--``,
exactly as on the other backends. execd's access token travels in a Secret of the Pod's
own (never in the Pod spec, which anyone allowed to list Pods can read); registry
credentials of the request travel in a pull Secret. Both are owned by the Pod, so the
cluster's garbage collector removes them with it even if sandlot does not.
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from sandlot.config import DEFAULT_DROPPED_CAPABILITIES, KubernetesConfig
from sandlot.errors import InvalidRequest, Unsupported
from sandlot.runtime.base import SandboxSpec, VolumeSpec
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.kubernetes import bundle_image

LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "sandlot"
LABEL_OWNER = "sandlot.io/owner"  # which sandlot installation a Pod belongs to
LABEL_SANDBOX = "sandlot.io/sandbox-id"
LABEL_WARM = "sandlot.io/warm"  # an unclaimed pre-started Pod of a pool ("true")
ANNOTATION_SANDBOX = "sandlot.io/sandbox-id"
ANNOTATION_METADATA = "sandlot.io/metadata"
ANNOTATION_EXTENSIONS = "sandlot.io/extensions"
NAME_PREFIX = "sandlot-"
SANDBOX_CONTAINER = "sandbox"
BUNDLE_VOLUME = "sandlot-execd"
CACHE_VOLUME = "sandlot-execd-cache"  # node-cache: the node's cache root, init container only
CACHE_MOUNT = "/sandlot-cache"
INIT_COPY = "sandlot-execd-installer"
INIT_FILL = "sandlot-execd-cache"
HOSTNAME_LABEL = "kubernetes.io/hostname"
RUN_VOLUME = "sandlot-run"
RUN_DIR = "/run/sandlot"
ENTRYPOINT_LOG = f"{RUN_DIR}/entrypoint.log"
TOKEN_KEY = "execd-token"
# A Pod name is a DNS-1123 subdomain; sandlot keeps it a label (<= 63) so it can be a hostname.
_ID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_ID = 63 - len(NAME_PREFIX) - len("-pull")


def pod_name(sandbox_id: str) -> str:
    return NAME_PREFIX + sandbox_id


def token_secret_name(sandbox_id: str) -> str:
    return f"{NAME_PREFIX}{sandbox_id}-execd"


def pull_secret_name(sandbox_id: str) -> str:
    return f"{NAME_PREFIX}{sandbox_id}-pull"


def check_id(sandbox_id: str) -> None:
    """Sandbox ids must make valid Pod names (server-made ids, UUIDs, always do)."""
    if len(sandbox_id) > _MAX_ID or not _ID.match(sandbox_id):
        raise InvalidRequest(
            f"invalid sandbox id {sandbox_id!r} for the kubernetes runtime: use at most "
            f"{_MAX_ID} lowercase letters, digits and '-'"
        )


def cpu_quantity(cores: float) -> str:
    return f"{max(1, round(cores * 1000))}m"


@dataclass(frozen=True)
class PodPlan:
    """Everything fixed at start that shapes each Pod."""

    cfg: KubernetesConfig
    bundle: ExecdBundle  # where execd is inside the sandbox container (mount point only)
    bundle_image: str
    owner: str
    execd_port: int
    runtime_class: str | None = None
    warm_pool_images: tuple[str, ...] = ()  # [runtime] warm_pool_images
    default_limits: tuple[tuple[str, str], ...] = ()  # [runtime] default_resources
    default_disk: str | None = None  # [runtime] default_ephemeral_storage
    cache_name: str | None = None  # execd_delivery = "node-cache": the cache entry's name

    @property
    def node_cache(self) -> bool:
        return self.cfg.execd_delivery == "node-cache"

    def cache_entry(self) -> str:
        assert self.cache_name is not None
        return f"{self.cfg.node_cache_dir.rstrip('/')}/{self.cache_name}"

    def sandbox_labels(self, sandbox_id: str) -> dict[str, str]:
        return {LABEL_MANAGED: MANAGED_BY, LABEL_OWNER: self.owner, LABEL_SANDBOX: sandbox_id}

    def labels(self, spec: SandboxSpec, warm: bool = False) -> dict[str, str]:
        labels = self.sandbox_labels(spec.sandbox_id)
        if warm:
            labels[LABEL_WARM] = "true"
        return labels

    def execd_command(self, spec: SandboxSpec, pooled: bool = False) -> list[str]:
        argv = [*self.bundle.python_argv(), "-m", "sandlot.execd",
                "--listen", f"tcp:0.0.0.0:{self.execd_port}", "--entrypoint-log", ENTRYPOINT_LOG]
        if pooled:
            argv.append("--pooled")
        if spec.entrypoint:
            argv += ["--", *spec.entrypoint]
        return argv

    def env(self, spec: SandboxSpec) -> list[dict[str, Any]]:
        values = dict(spec.env)
        private = self.bundle.env()
        values.update(private)
        values["SANDLOT_EXECD_PRIVATE_ENV"] = ",".join([*private, "SANDLOT_EXECD_TOKEN"])
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
        if spec.execd_token:
            env.append({"name": "SANDLOT_EXECD_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": token_secret_name(spec.sandbox_id), "key": TOKEN_KEY}}})
        return env

    def resources(self, spec: SandboxSpec) -> dict[str, dict[str, str]]:
        """Limits from the request's ``resourceLimits``; requests from its ``resourceRequests``,
        else ``request_fraction`` of the limits (1: as upstream, Guaranteed QoS)."""
        limits: dict[str, str] = {}
        requests: dict[str, str] = {}
        fraction = self.cfg.request_fraction
        if spec.cpu_cores is not None:
            limits["cpu"] = cpu_quantity(spec.cpu_cores)
            requests["cpu"] = cpu_quantity(spec.cpu_cores * fraction)
        if spec.memory_bytes is not None:
            limits["memory"] = str(spec.memory_bytes)
            requests["memory"] = str(max(1 << 20, int(spec.memory_bytes * fraction)))
        if spec.disk_bytes is not None:
            limits["ephemeral-storage"] = str(spec.disk_bytes)
            requests["ephemeral-storage"] = str(spec.disk_bytes)
        if spec.cpu_request_cores is not None:
            requests["cpu"] = cpu_quantity(spec.cpu_request_cores)
        if spec.memory_request_bytes is not None:
            requests["memory"] = str(spec.memory_request_bytes)
        out: dict[str, dict[str, str]] = {}
        if limits:
            out["limits"] = limits
        if requests:
            out["requests"] = requests
        return out

    def security_context(self) -> dict[str, Any]:
        return {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": list(self.cfg.drop_capabilities
                                          if self.cfg.drop_capabilities is not None
                                          else DEFAULT_DROPPED_CAPABILITIES)},
            "seccompProfile": {"type": "RuntimeDefault"},
            "readOnlyRootFilesystem": self.cfg.read_only_root_filesystem,
            "runAsUser": 0,  # execd runs commands as any uid a request names (as upstream)
        }

    def init_container(self) -> dict[str, Any]:
        """Copy mode: copy the bundle into the Pod's emptyDir. Node-cache mode: fill or
        verify the node's entry (the only container that mounts the cache writable)."""
        if self.node_cache:
            assert self.cache_name is not None
            name = INIT_FILL
            argv, env = bundle_image.fill_command(CACHE_MOUNT, self.cache_name)
            mounts = [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}]
        else:
            name = INIT_COPY
            argv, env = bundle_image.copy_command(self.bundle.mount_point)
            mounts = [{"name": BUNDLE_VOLUME, "mountPath": self.bundle.mount_point}]
        resources = {k: dict(v) for k, v in self.cfg.execd_init_resources.items()}
        return {
            "name": name,
            "image": self.bundle_image,
            "imagePullPolicy": self.cfg.bundle_image_pull_policy,
            "command": argv,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "volumeMounts": mounts,
            "securityContext": {**self.security_context(), "readOnlyRootFilesystem": True},
            **({"resources": resources} if resources else {}),
        }

    def bundle_volumes(self, cached_on: tuple[str, ...] | None) -> list[dict[str, Any]]:
        """The bundle's volume (and, while the node may lack the entry, the cache root).

        The entry's hostPath has no ``type``: the kubelet checks a typed path before the
        init container could create it; an entry that went missing is made empty by the
        runtime, execd fails to start, and the next fill replaces it."""
        if not self.node_cache:
            return [{"name": BUNDLE_VOLUME, "emptyDir": {}}]
        volumes: list[dict[str, Any]] = [
            {"name": BUNDLE_VOLUME, "hostPath": {"path": self.cache_entry()}}]
        if cached_on is None:
            volumes.append({"name": CACHE_VOLUME, "hostPath": {
                "path": self.cfg.node_cache_dir, "type": "DirectoryOrCreate"}})
        return volumes

    def pod(self, spec: SandboxSpec, *, pull_secret: bool = False, pooled: bool = False,
            cached_on: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The Pod manifest of ``spec`` (``pooled``: a warm Pod, claimed later).

        ``cached_on`` (node-cache mode): the nodes known to hold a verified cache entry;
        the Pod is bound to them and has no init container. None: the init container fills
        or verifies the entry on whichever node the Pod lands."""
        check_id(spec.sandbox_id)
        if self.node_cache:
            self.check_cache_not_exposed(spec.volumes)
        volumes: list[dict[str, Any]] = [
            *self.bundle_volumes(cached_on),
            {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        ]
        mounts: list[dict[str, Any]] = [
            {"name": BUNDLE_VOLUME, "mountPath": self.bundle.mount_point, "readOnly": True},
            {"name": RUN_VOLUME, "mountPath": RUN_DIR},
        ]
        for index, vol in enumerate(spec.volumes):
            volume, mount = volume_of(vol, index)
            volumes.append(volume)
            mounts.append(mount)
        container: dict[str, Any] = {
            "name": SANDBOX_CONTAINER,
            "image": spec.image.reference,
            "imagePullPolicy": self.cfg.image_pull_policy,
            "command": self.execd_command(spec, pooled),
            "args": [],
            "env": self.env(spec),
            "ports": [{"name": "execd", "containerPort": self.execd_port}],
            "resources": self.resources(spec),
            "securityContext": self.security_context(),
            "volumeMounts": mounts,
        }
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostname": spec.sandbox_id[:63],
            "terminationGracePeriodSeconds": self.cfg.termination_grace_period_seconds,
            "initContainers": [] if cached_on is not None else [self.init_container()],
            "containers": [container],
            "volumes": volumes,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        }
        if self.cfg.service_account:
            pod_spec["serviceAccountName"] = self.cfg.service_account
        if self.runtime_class:
            pod_spec["runtimeClassName"] = self.runtime_class
        if self.cfg.node_selector:
            pod_spec["nodeSelector"] = dict(self.cfg.node_selector)
        if cached_on is not None:
            pod_spec["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In",
                                           "values": list(cached_on)}]}]}}}
        if self.cfg.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in self.cfg.tolerations]
        pull = [{"name": s} for s in self.cfg.image_pull_secrets]
        if pull_secret:
            pull.append({"name": pull_secret_name(spec.sandbox_id)})
        if pull:
            pod_spec["imagePullSecrets"] = pull
        annotations = {ANNOTATION_SANDBOX: spec.sandbox_id}
        if spec.metadata:
            annotations[ANNOTATION_METADATA] = json.dumps(spec.metadata, sort_keys=True)
        if spec.extensions:
            annotations[ANNOTATION_EXTENSIONS] = json.dumps(spec.extensions, sort_keys=True)
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(spec.sandbox_id), "labels": self.labels(spec, pooled),
                         "annotations": annotations},
            "spec": pod_spec,
        }

    def check_cache_not_exposed(self, volumes: list[VolumeSpec]) -> None:
        """A host volume must not reach the node cache: a sandbox that could write there
        would change what every later sandbox on the node executes."""
        cache = self.cfg.node_cache_dir.rstrip("/") + "/"
        for vol in volumes:
            if vol.kind != "host":
                continue
            source = posixpath.normpath(vol.source).rstrip("/") + "/"
            if source.startswith(cache) or cache.startswith(source):
                raise InvalidRequest(
                    f"volume {vol.name!r}: host path {vol.source} overlaps the execd node "
                    f"cache {self.cfg.node_cache_dir} ([kubernetes] node_cache_dir)")

    def token_secret(self, spec: SandboxSpec) -> dict[str, Any]:
        assert spec.execd_token is not None
        return self._secret(token_secret_name(spec.sandbox_id), spec, "Opaque",
                            {TOKEN_KEY: spec.execd_token})

    def pull_secret(self, spec: SandboxSpec) -> dict[str, Any]:
        auth = spec.image.auth
        assert auth is not None
        registry = registry_of(spec.image.reference)
        pair = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        config = {"auths": {registry: {"username": auth.username, "password": auth.password,
                                       "auth": pair}}}
        return self._secret(pull_secret_name(spec.sandbox_id), spec,
                            "kubernetes.io/dockerconfigjson",
                            {".dockerconfigjson": json.dumps(config)})

    def _secret(self, name: str, spec: SandboxSpec, kind: str,
                data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "labels": self.labels(spec)},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }


def registry_of(reference: str) -> str:
    """The registry host of an image reference (Docker Hub's when it names none)."""
    first, sep, _ = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "https://index.docker.io/v1/"


def volume_of(vol: VolumeSpec, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Pod volume and container mount of one request volume (host -> hostPath,
    pvc -> persistentVolumeClaim)."""
    name = f"vol-{index}"
    if vol.kind == "host":
        volume: dict[str, Any] = {"name": name, "hostPath": {"path": vol.source,
                                                             "type": "Directory"}}
    elif vol.kind == "pvc":
        volume = {"name": name, "persistentVolumeClaim": {"claimName": vol.source,
                                                          "readOnly": vol.read_only}}
    else:
        raise Unsupported(f"volume {vol.name!r}: {vol.kind} volumes are not supported by the "
                          "kubernetes runtime (host and pvc are)")
    mount: dict[str, Any] = {"name": name, "mountPath": vol.mount_path,
                             "readOnly": vol.read_only}
    if vol.sub_path:
        mount["subPath"] = vol.sub_path
    return volume, mount
