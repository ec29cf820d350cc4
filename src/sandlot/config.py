"""sandlot's configuration: one TOML file, accepting the OpenSandbox server keys that apply.

The reference server's keys (``[server] host/port/api_key/max_sandbox_timeout_seconds``,
``[runtime] type``) mean the same here; everything else is sandlot's own and documented in
``docs/configuration.md``. Keys the models below do not have are audited at load
(``config_audit``): refused when ignoring them would weaken security, warned about otherwise.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from sandlot.config_audit import audit
from sandlot.server.endpoint_ports import PortRange

DEFAULT_DATA_DIR = Path("/var/lib/sandlot")
API_KEY_ENV = "OPENSANDBOX_SERVER_API_KEY"
NETWORK_MODE_ENV = "SANDLOT_NETWORK_MODE"
# [store] url from the environment (a Kubernetes Secret's DSN; deploy/kubernetes/)
STORE_URL_ENV = "SANDLOT_STORE_URL"


class _Section(BaseModel):
    # Unknown keys are tolerated by the model so that an OpenSandbox server config file
    # loads; ``config_audit`` names each of them (warning or refusal) instead.
    model_config = ConfigDict(extra="ignore")


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_sandbox_timeout_seconds: int | None = None
    # Host name or address put into direct endpoints handed to clients.
    endpoint_host: str = "127.0.0.1"
    insecure_no_auth: bool = False
    # How long a create request may wait for its sandbox to be Running before it answers
    # (with Pending if not yet); 0 answers at once.
    create_wait_seconds: float = 3.0
    # Largest lifecycle request body (JSON) the server reads; the proxy streams and is exempt.
    max_request_body_bytes: int = 1 << 20
    # Direct endpoints (a host listener per sandbox port): at most this many per sandbox,
    # this many open connections per sandbox, and idle connections closed after this long.
    max_endpoints_per_sandbox: int = Field(default=32, ge=1)
    max_connections_per_sandbox: int = Field(default=1024, ge=1)
    endpoint_idle_timeout_seconds: float = Field(default=300.0, gt=0)
    # Host ports for direct endpoints, "LOW-HIGH" ("0": any free port): below the kernel's
    # ephemeral range, so no outgoing connection takes an endpoint's port while the server
    # is down and the endpoint keeps it across a restart (server/endpoint_ports.py).
    endpoint_ports: str = "20000-32767"
    # Slow clients of the API (and, fixed, of execd): the request head must arrive within
    # header_timeout_seconds of the connection (or of a kept-alive request's first byte); a
    # request body may pause at most body_idle_timeout_seconds (sandlot.http_deadlines).
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    body_idle_timeout_seconds: float = Field(default=60.0, gt=0)
    # The reference server's uvicorn keys. Keep-alive is 75 s (the reference: 30), longer
    # than the released SDKs keep idle connections for reuse (30 s), so the server never
    # closes a connection a client is about to send on. limit_concurrency: connections and
    # tasks at once before uvicorn answers 503 (0: no cap).
    timeout_keep_alive: int = Field(default=75, ge=1)
    limit_concurrency: int = Field(default=1024, ge=0)
    backlog: int = Field(default=2048, ge=1)

    @field_validator("endpoint_ports")
    @classmethod
    def _valid_port_range(cls, value: str) -> str:
        PortRange.parse(value)
        return value


class RuntimeConfig(_Section):
    # A backend registered under the sandlot.runtimes entry points (sandlot.runtime.registry).
    type: str = "oci"
    # OCI runtime binary: runc by default; crun on cgroup-v2-only hosts; runsc for gVisor
    # (chosen by [secure_runtime] type = "gvisor").
    oci_binary: str | None = None
    # What pausing a sandbox does: "freeze" keeps its memory (cgroup freezer / runsc pause);
    # "hibernate" (runsc only) checkpoints processes and memory to disk and frees them.
    # A create may choose per sandbox with extensions["sandlot.pause.mode"].
    pause_mode: Literal["freeze", "hibernate"] = "freeze"
    # gVisor platform: "auto" is systrap where the runsc build has it (gVisor >= 2023), else
    # ptrace; "ptrace" works everywhere; "kvm" needs a usable /dev/kvm.
    runsc_platform: Literal["auto", "systrap", "ptrace", "kvm"] = "auto"
    pids_limit: int = 4096
    # Warm pool (oci): this many pre-started sandboxes per listed image, claimed by create.
    warm_pool_size: int = 2
    warm_pool_images: list[str] = Field(default_factory=lambda: ["base"])
    # oci, docker: the first create from a snapshot (or template) starts a warm pool of it,
    # this many pre-started sandboxes (0: creates from snapshots always start cold), kept for
    # at most snapshot_pools_max snapshots at once (the least recently used is drained for a
    # new one) and drained after snapshot_pool_idle_seconds without a create from it.
    snapshot_pool_size: int = Field(default=2, ge=0)
    snapshot_pools_max: int = Field(default=4, ge=0)
    snapshot_pool_idle_seconds: float = Field(default=600.0, gt=0)
    # oci: container starts (runc + execd start-up) run at once; more creates queue, requests
    # before warm-pool refills (runtime/admission.py). 0: 2 per CPU (4 with the zygote).
    max_concurrent_starts: int = Field(default=0, ge=0)
    # oci + runc, sandboxes with a user namespace: how execd starts. "exec": runc runs a
    # fresh interpreter as PID 1; "zygote" (default): a pre-imported execd is forked into
    # the sandbox (docs/runtime.md). Others (runsc, no user namespace) always use "exec".
    execd_launch: Literal["exec", "zygote"] = "zygote"
    # Cap on a sandbox's writable layer when a create names no resourceLimits
    # "ephemeral-storage" (a quantity such as "2Gi"); unset = no cap (docs/volumes.md).
    default_ephemeral_storage: str | None = None

    # oci: run each sandbox in a user namespace of its own uid range (root inside is an
    # unprivileged host uid). "auto": where the kernel supports idmapped layers.
    user_namespaces: bool | Literal["auto"] = "auto"
    # Limits of a sandbox whose create omits them (resourceLimits keys: cpu, memory, pids),
    # and the largest a create may ask for (unset keys: the host's CPUs, its memory and
    # pids_limit). Applied to every create, whichever client sends it.
    default_resources: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "2Gi"})
    max_resources: dict[str, str] = Field(default_factory=dict)
    # Live sandboxes (not yet deleted or failed) one server holds at most; 0: no cap.
    max_sandboxes: int = Field(default=200, ge=0)


class StorageConfig(_Section):
    """Upstream's ``[storage]`` section: where host volumes may come from."""

    # Host directories (and everything below them) that ``host`` volumes may bind; empty:
    # host volumes are refused. Symlinks are resolved before the check.
    allowed_host_paths: list[str] = Field(default_factory=list)


class SecureRuntimeConfig(_Section):
    """Upstream's ``[secure_runtime]``: a stronger boundary than runc.

    ``type = "gvisor"`` runs sandboxes under gVisor: the oci runtime uses ``runsc``, the
    docker runtime uses the engine runtime named by ``docker_runtime``. The other upstream
    types (kata, firecracker) are not implemented: ``UNSUPPORTED_VALUES`` hands them to the
    config audit, which refuses them at start (never a silent fall-back to runc).
    The kubernetes runtime uses the RuntimeClass named by ``k8s_runtime_class``.
    """

    UNSUPPORTED_VALUES: ClassVar[dict[str, tuple[str, ...]]] = {
        "type": ("kata", "firecracker"),
    }

    type: str = ""
    docker_runtime: str | None = None
    k8s_runtime_class: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SecureRuntimeConfig:
        if self.type not in ("", "gvisor", *self.UNSUPPORTED_VALUES["type"]):
            raise ValueError(f"[secure_runtime] type must be \"\" or \"gvisor\", not {self.type!r}")
        if self.type == "" and self.k8s_runtime_class:
            raise ValueError(
                '[secure_runtime] k8s_runtime_class needs a type (e.g. type = "gvisor")')
        if self.type == "" and self.docker_runtime:
            raise ValueError('[secure_runtime] docker_runtime needs a type (e.g. type = "gvisor")')
        return self

    @property
    def gvisor(self) -> bool:
        return self.type == "gvisor"


class StoreConfig(_Section):
    # "sqlite" (file in the data dir) or a SQLAlchemy URL such as postgresql+asyncpg://...
    url: str | None = None


class TenantsConfig(_Section):
    """``[tenants]``: where the tenants file is (docs/tenants.md). Unset: the reference's
    ``SANDBOX_TENANTS_CONFIG_PATH``, else ``~/.opensandbox/tenants.toml`` when it exists."""

    file: str | None = None


class ImagesConfig(_Section):
    # Registries reached over plain HTTP (e.g. a test registry on loopback).
    insecure_registries: list[str] = Field(default_factory=list)


class ExecdConfig(_Section):
    port: int = 44772


class NetworkConfig(_Section):
    # isolated: own namespace, outbound per policy through a veth + NAT (default);
    # none: loopback only; host: the server's namespace, unfenced, only with
    # allow_host_mode = true and a warning at every start (see docs/network.md).
    # The default may come from SANDLOT_NETWORK_MODE (test suites running servers in the
    # machine's own namespace set "none"); a value in the file wins.
    mode: Literal["isolated", "none", "host"] = Field(
        default_factory=lambda: os.environ.get(NETWORK_MODE_ENV, "isolated"),
        validate_default=True)
    # Addresses handed to sandboxes (one /30 each); must not overlap the host's routes.
    subnet: str = "100.88.0.0/16"
    # Upstream resolvers of the DNS filter; empty: the host's /etc/resolv.conf nameservers.
    dns_servers: list[str] = Field(default_factory=list)
    # Destinations exempt from the default deny of private/host ranges (a proxy, a mirror).
    allow_cidrs: list[str] = Field(default_factory=list)
    # The explicit opt-in mode "host" needs (sandlot.net.hostmode).
    allow_host_mode: bool = False


class EgressConfig(_Section):
    # dns: names are filtered by the DNS filter only; dns+nft: also only addresses the filter
    # answered (or IP/CIDR rules allowed) can be connected to when the default is deny.
    mode: Literal["dns", "dns+nft"] = "dns+nft"
    # The reference's image and disable_ipv6 keys are judged by config_audit (a sidecar
    # image is warned about; IPv6 is always off inside sandboxes, so false is refused).


# The reference server's default: what its sandboxes may not do.
DEFAULT_DROPPED_CAPABILITIES = [
    "AUDIT_WRITE", "MKNOD", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE",
    "SYS_TIME", "SYS_TTY_CONFIG",
]


class DockerConfig(_Section):
    """``[docker]``: the reference server's keys for ``[runtime] type = "docker"``.

    The engine is found as docker-py (and the reference server) find it: ``DOCKER_HOST``,
    else the local socket. See docs/configuration.md for each key.
    """

    network_mode: str = "host"  # host | bridge | none | a user-defined network's name
    host_ip: str | None = None  # host put into endpoint URLs (as [server] endpoint_host)
    port_range_min: int = Field(default=40000, ge=1, le=65535)
    port_range_max: int = Field(default=60000, ge=1, le=65535)
    api_timeout: int | None = Field(default=None, ge=1)
    no_new_privileges: bool = True
    pids_limit: int | None = Field(default=4096, ge=1)
    drop_capabilities: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DROPPED_CAPABILITIES)
    )
    seccomp_profile: str | None = None  # empty/unset: sandlot's own (the oci runtime's)
    apparmor_profile: str | None = None  # empty/unset: the engine's default


class LogConfig(_Section):
    """``[log]``: the reference server's keys, plus ``format`` (sandlot's own)."""

    level: str = Field(default="INFO", min_length=3)
    format: Literal["text", "json"] = "text"  # json: one object per line
    file_enabled: bool = False
    file_path: str | None = None  # default with file_enabled: ~/logs/sandlot/server.log
    access_file_path: str | None = None  # default with file_enabled: ~/logs/sandlot/access.log
    file_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    file_backup_count: int = Field(default=5, ge=0)


class DiagnosticsConfig(_Section):
    """``[diagnostics]``: sandlot's own (the reference has no such section)."""

    # How long events and the last logs of an ended sandbox stay readable.
    retention_seconds: float = Field(default=86400.0, ge=0)
    # Largest inline payload of GET .../diagnostics/logs|events (the tail is kept).
    max_inline_bytes: int = Field(default=1 << 20, ge=1024)
    # How payloads are delivered (the spec's ``delivery``): "inline" in the answer (cut to
    # max_inline_bytes); "auto": inline up to max_inline_bytes, larger ones by a short-lived
    # download URL served by sandlot (up to max_url_bytes); "url": always by URL.
    delivery: Literal["inline", "auto", "url"] = "inline"
    max_url_bytes: int = Field(default=16 << 20, ge=1024)
    url_ttl_seconds: float = Field(default=300.0, gt=0, le=86400)
    # How often live sandboxes' cgroups are sampled (metrics, OOM events); 0 turns it off.
    sample_interval_seconds: float = Field(default=5.0, ge=0)


class MetricsConfig(_Section):
    """``[metrics]``: the Prometheus endpoint ``GET /metrics``."""

    enabled: bool = True
    open: bool = False  # true: served without the API key (for a scraper on a trusted net)
    per_sandbox: bool = True  # per-sandbox CPU/memory series (one pair per live sandbox)


class TracingConfig(_Section):
    """``[tracing]``: OpenTelemetry spans of creates and proxied requests, sent over OTLP."""

    otlp_endpoint: str | None = None  # e.g. "http://127.0.0.1:4318/v1/traces"; unset = off
    service_name: str = "sandlot"
class ConsoleConfig(_Section):
    """The web console at ``/console`` (docs/console.md)."""

    enabled: bool = True
    # A browser session ends after this long unused, and at the latest this long after sign-in.
    session_idle_seconds: int = Field(default=2 * 3600, ge=60)
    session_lifetime_seconds: int = Field(default=12 * 3600, ge=60)


class KubernetesConfig(_Section):
    """``[kubernetes]``: upstream's keys that apply to sandlot's Pod-per-sandbox runtime
    (``[runtime] type = "kubernetes"``) and sandlot's own; see docs/runtime-kubernetes.md.

    Upstream's informer and rate-limiter tuning and its workload providers are not fields:
    the config audit warns that they are ignored.
    """

    # Upstream's keys.
    kubeconfig_path: str | None = None  # unset: $KUBECONFIG, else the in-cluster account
    namespace: str = "default"
    service_account: str | None = None  # the sandbox Pods' (its token is never mounted)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    sandbox_create_timeout_seconds: int = Field(default=120, ge=1)
    # {limits = {...}, requests = {...}} of the init container that installs execd.
    execd_init_resources: dict[str, dict[str, str]] = Field(default_factory=dict)
    # sandlot's own.
    # How the server reaches execd and sandbox ports: "pod-ip" where Pod addresses route
    # (in the cluster, or a host on the Pod network), "port-forward" through the API server.
    connect_mode: Literal["pod-ip", "port-forward"] = "pod-ip"
    # The image carrying the execd bundle (unset: sandlot.local/execd-bundle:<bundle key>,
    # loaded into nodes or a registry with `sandlot kubernetes bundle-image`).
    execd_bundle_image: str | None = None
    bundle_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # How execd reaches a Pod: "copy" (an init container copies the bundle into an emptyDir,
    # every Pod; works on any cluster) or "node-cache" (a hostPath entry per node and bundle
    # digest, filled once and mounted read-only; later Pods start without an init container).
    execd_delivery: Literal["copy", "node-cache"] = "copy"
    # The node directory of "node-cache" (root-only; sandboxes never get it as a volume).
    node_cache_dir: str = Field(default="/var/lib/sandlot/execd-cache", pattern=r"^/.+")
    # Requests are this fraction of the limits: 1 (upstream) gives Guaranteed QoS; less
    # overcommits a small cluster.
    request_fraction: float = Field(default=1.0, gt=0, le=1)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    image_pull_secrets: list[str] = Field(default_factory=list)  # Secrets every Pod may use
    read_only_root_filesystem: bool = False  # true breaks images that write outside volumes
    drop_capabilities: list[str] | None = None  # unset: [docker]'s default list
    termination_grace_period_seconds: int = Field(default=2, ge=0)
    # Warm Pods kept of each of [runtime] warm_pool_images in the default shape, claimed by
    # creates that match (0: none; [runtime] warm_pool_size is the single-host backends').
    warm_pool_size: int = Field(default=0, ge=0)
    # Marks this sandlot's Pods; unset: an id kept in data_dir (set it when data_dir is
    # not persistent, e.g. in the cluster deployment).
    owner: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    # Egress (see docs/runtime-kubernetes.md): the IPv4 address Pods use as their only
    # resolver (dnsConfig), where sandlot's DNS filter answers per sandbox by the query's
    # source Pod IP. Unset: networkPolicy is refused on this runtime.
    dns_filter_address: str | None = None
    # host:port the server's DNS filter listens on (unset: dns_filter_address:53), e.g.
    # "0.0.0.0:5353" behind a Service that maps port 53 to it.
    dns_filter_listen: str | None = None
    # The NetworkPolicyPeer through which sandbox Pods reach the filter (unset: an ipBlock
    # of dns_filter_address/32), e.g. a podSelector of the sandlot server's Pods.
    dns_filter_peer: dict[str, Any] | None = None
    # Whether the cluster's network plugin enforces NetworkPolicy (Kubernetes cannot say):
    # false refuses policies that deny by address in [egress] mode "dns+nft".
    network_policy_enforced: bool = False


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    secure_runtime: SecureRuntimeConfig = Field(default_factory=SecureRuntimeConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    images: ImagesConfig = Field(default_factory=ImagesConfig)
    execd: ExecdConfig = Field(default_factory=ExecdConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    tenants: TenantsConfig = Field(default_factory=TenantsConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    data_dir: Path = DEFAULT_DATA_DIR
    _warnings: list[str] = PrivateAttr(default_factory=list)
    _refusals: list[str] = PrivateAttr(default_factory=list)

    @field_validator("tenants", mode="before")
    @classmethod
    def _tenants_elsewhere(cls, value: object) -> object:
        if isinstance(value, list):  # [[tenants]] entries belong in the tenants file
            raise ValueError("[[tenants]] entries go in the tenants file (tenants.toml, "
                             'docs/tenants.md); here only [tenants] file = "PATH"')
        return value

    @model_validator(mode="after")
    def _docker_host_ip(self) -> Config:
        """``[docker] host_ip`` is the host in endpoint URLs unless endpoint_host is set."""
        if (self.runtime.type == "docker" and self.docker.host_ip
                and "endpoint_host" not in self.server.model_fields_set):
            self.server.endpoint_host = self.docker.host_ip
        return self

    @classmethod
    def load(cls, path: Path | None = None) -> Config:
        """Read ``path`` (if given), audit its keys, then apply the environment's API key.

        ``OPENSANDBOX_SERVER_API_KEY``, when set, takes precedence over the file (as in
        OpenSandbox); set but empty, it clears the key. ``SANDLOT_STORE_URL``, when set and
        not empty, takes precedence over ``[store] url``.
        """
        raw: dict = {}
        if path is not None:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        cfg = cls.model_validate(raw)
        found = audit(raw, cls)
        cfg._warnings, cfg._refusals = found.warnings, found.refusals
        if API_KEY_ENV in os.environ:
            cfg.server.api_key = os.environ[API_KEY_ENV] or None
        if os.environ.get(STORE_URL_ENV):
            cfg.store.url = os.environ[STORE_URL_ENV]
        return cfg

    def warnings(self) -> list[str]:
        """Keys of the loaded file that sandlot ignores (logged at start)."""
        return list(self._warnings)

    def refusals(self) -> list[str]:
        """Keys whose being ignored would weaken security: ``sandlot serve`` refuses them."""
        return list(self._refusals)

    @property
    def store_url(self) -> str:
        """``[store] url``; unset, empty or the bare word ``sqlite``: SQLite in ``data_dir``."""
        url = (self.store.url or "").strip()
        if not url or url.lower() == "sqlite":
            return f"sqlite+aiosqlite:///{self.data_dir / 'sandlot.db'}"
        return url


CONFIG_TEMPLATE = """\
# sandlot configuration. Keys in [server] and [runtime] mean what they mean in OpenSandbox.
data_dir = "/var/lib/sandlot"

[server]
host = "127.0.0.1"
port = 8080
# Clients send it in the OPEN-SANDBOX-API-KEY header. May also come from
# the OPENSANDBOX_SERVER_API_KEY environment variable.
api_key = "{api_key}"
# Longest lifetime a create request may ask for (omit for no limit).
max_sandbox_timeout_seconds = 86400

[runtime]
type = "oci"          # oci (no daemon needed) | docker
# oci_binary = "runc" # runc, crun or runsc
pids_limit = 4096
# Limits of a create that names none, and the most a create may ask for.
default_resources = { cpu = "1", memory = "2Gi" }
# default: host CPUs/memory/disk
# max_resources = { cpu = "4", memory = "8Gi", pids = "4096", ephemeral-storage = "20Gi" }
max_sandboxes = 200
# Pre-started sandboxes per pooled image, claimed by creates in a few ms (0 turns it off).
warm_pool_size = 2
warm_pool_images = ["base"]
# Warm sandboxes of each snapshot created from (0 = always cold), for at most
# snapshot_pools_max snapshots, each drained after snapshot_pool_idle_seconds unused.
# snapshot_pool_size = 2
# snapshot_pools_max = 4
# snapshot_pool_idle_seconds = 600
# Container starts at once (more creates queue, before pool refills); 0 = 4 per CPU with
# the execd zygote, else 2.
# max_concurrent_starts = 0
# How execd starts under runc with a user namespace: "zygote" or "exec" (docs/runtime.md).
# execd_launch = "zygote"

# Pausing: "freeze" keeps memory; "hibernate" (gVisor only) checkpoints to disk.
# pause_mode = "freeze"

# [secure_runtime]
# type = "gvisor"             # sandboxes under gVisor (runsc) instead of runc
# docker_runtime = "runsc"    # engine runtime name when [runtime] type = "docker"

# Cap on each sandbox's writable layer unless a create asks for resourceLimits
# "ephemeral-storage" itself (see docs/volumes.md); unset = uncapped.
# default_ephemeral_storage = "10Gi"

[storage]
# Host directories that `host` volumes may bind (nothing else; empty = no host volumes).
allowed_host_paths = []

# [tenants]
# file = "/etc/sandlot/tenants.toml"   # per-tenant API keys and quotas (docs/tenants.md)

[store]
# url = "postgresql+asyncpg://user:pass@127.0.0.1/sandlot"   # default: SQLite in data_dir

[images]
insecure_registries = []

[network]
mode = "isolated"     # isolated (outbound per policy) | none (loopback only) | host (see docs)
subnet = "100.88.0.0/16"
# dns_servers = ["192.0.2.53"]   # default: the host's resolvers
# allow_cidrs = ["10.1.2.3/32"]  # e.g. a corporate proxy, exempt from the private-range deny

[egress]
mode = "dns+nft"      # dns | dns+nft
"""
