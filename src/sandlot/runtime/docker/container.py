"""What the engine is asked to create for a sandbox: execd as init, limits, hardening, labels.

execd is not baked into an image: sandlot's read-only bundle (``execd_bundle``) is
bind-mounted at the same place as in the OCI backend and started the same way, as the
container's init, with the user's entrypoint after ``--`` (execd starts it once it
listens). Its token and private variables travel in the environment and are scrubbed by
execd before anything else runs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docker.types import Mount

from sandlot.config import DockerConfig
from sandlot.errors import RuntimeFailure
from sandlot.runtime.base import SandboxSpec
from sandlot.runtime.docker.images import EngineImage
from sandlot.runtime.docker.network import NetworkKind, NetworkMode
from sandlot.runtime.execd_bundle import MOUNT_POINT, ExecdBundle
from sandlot.runtime.oci.claimops import WARM_CPU_SHARES
from sandlot.runtime.oci.pool import is_pool_id
from sandlot.runtime.oci.seccomp import seccomp_profile
from sandlot.runtime.oci.spec import EXECD_OOM_SCORE_ADJ, can_lower_oom_score_adj

log = logging.getLogger(__name__)

LABEL_SANDBOX = "io.sandlot.sandbox-id"
LABEL_OWNER = "io.sandlot.owner"  # which sandlot (data dir) a container belongs to
LABEL_EXECD_PORT = "io.sandlot.execd-port"  # host-network sandboxes only
LABEL_POOL = "io.sandlot.warm"  # made as a warm container (it may be claimed since)
# A container's name is its identity: ``sandlot-<sandbox id>``, or ``sandlot-_pool-<hex>`` for
# a warm container, renamed to its sandbox's name when claimed.
NAME_PREFIX = "sandlot-"
RUN_DIR = "/run/sandlot"
ENTRYPOINT_LOG = f"{RUN_DIR}/entrypoint.log"
WORKSPACE = "/workspace"
NANO = 1_000_000_000
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}}


def container_name(sandbox_id: str) -> str:
    return NAME_PREFIX + sandbox_id


def hostname(sandbox_id: str) -> str:
    """A sandbox's hostname; a warm container's (its pool id) without the underscore."""
    return sandbox_id.lstrip("_")[:63]


def sandbox_of(name: str) -> str | None:
    """The sandbox id a container name stands for (None: not a sandbox's name)."""
    name = name.lstrip("/")
    if not name.startswith(NAME_PREFIX) or is_pool_id(name[len(NAME_PREFIX):]):
        return None
    return name[len(NAME_PREFIX):]


def security_options(cfg: DockerConfig) -> list[str]:
    """``security_opt`` from ``[docker]``; a seccomp profile file is read here, at start.

    Unset, the containers get sandlot's own seccomp profile (the OCI runtime's: its deny
    list and socket-family allow list), not the engine's default, so that a sandbox is held
    by the same rules on every backend (the engine's default lets AF_VSOCK through). The
    engine API takes a profile's JSON itself (the docker CLI reads files for its user), so
    an operator's file is read and checked once, and a bad one refuses the start.
    """
    opts: list[str] = []
    if cfg.no_new_privileges:
        opts.append("no-new-privileges=true")
    if cfg.apparmor_profile:
        opts.append(f"apparmor={cfg.apparmor_profile}")
    profile = (cfg.seccomp_profile or "").strip()
    if profile == "unconfined":
        log.warning("[docker] seccomp_profile = 'unconfined': sandboxes run without seccomp")
        opts.append("seccomp=unconfined")
    elif profile:
        path = Path(profile)
        if not path.is_absolute():
            raise RuntimeFailure(
                f"[docker] seccomp_profile {profile!r} must be an absolute path to a JSON "
                "profile, 'unconfined', or empty for sandlot's own profile"
            )
        try:
            text = path.read_text()
            json.loads(text)
        except (OSError, ValueError) as exc:
            raise RuntimeFailure(f"[docker] seccomp_profile {profile}: {exc}") from exc
        opts.append(f"seccomp={text}")
    else:
        # Docker's profile format is the OCI ``linux.seccomp`` object's shape.
        opts.append(f"seccomp={json.dumps(seccomp_profile())}")
    return opts


@dataclass(frozen=True)
class Plan:
    """Everything fixed at start that shapes each container."""

    bundle: ExecdBundle
    cfg: DockerConfig
    network: NetworkMode
    owner: str
    execd_port: int  # inside the sandbox's own network namespace
    security_opt: list[str]
    swap_limit: bool  # the engine can limit memory+swap
    engine_runtime: str | None = None  # an OCI runtime registered in the engine (e.g. runsc)

    def pids_limit(self, spec: SandboxSpec) -> int | None:
        """``[docker] pids_limit`` (null: no limit), never above the spec's."""
        if self.cfg.pids_limit is None:
            return None
        return min(self.cfg.pids_limit, spec.pids_limit)

    def execd_argv(
        self, spec: SandboxSpec, image: EngineImage, listen: str, pooled: bool = False
    ) -> list[str]:
        argv = [*self.bundle.python_argv(), "-m", "sandlot.execd", "--listen", listen,
                "--workdir", image.working_dir or WORKSPACE, "--entrypoint-log", ENTRYPOINT_LOG]
        if pooled:  # serves the claim once; the entrypoint comes with it
            argv.append("--pooled")
        if spec.entrypoint:
            argv += ["--", *spec.entrypoint]
        return argv

    def environment(self, spec: SandboxSpec) -> dict[str, str]:
        """The image's variables are added by the engine; these come on top."""
        env = dict(spec.env)
        private = self.bundle.env()
        env.update(private)
        env["SANDLOT_EXECD_PRIVATE_ENV"] = ",".join([*private, "SANDLOT_EXECD_TOKEN"])
        if spec.execd_token:
            env["SANDLOT_EXECD_TOKEN"] = spec.execd_token
        return env

    def create_kwargs(
        self, api: Any, spec: SandboxSpec, image: EngineImage, host_port: int | None,
        pooled: bool = False, volume_mounts: list[Mount] | None = None,
    ) -> dict[str, Any]:
        """Arguments of docker-py's ``APIClient.create_container`` for ``spec``.

        ``pooled``: a warm container (``spec`` has its pool id, no limits, no entrypoint),
        started at a low CPU weight so that it yields to sandboxes in use.
        """
        labels = {LABEL_SANDBOX: spec.sandbox_id, LABEL_OWNER: self.owner}
        if pooled:
            labels = {LABEL_POOL: spec.sandbox_id, LABEL_OWNER: self.owner}
        if self.network.kind == NetworkKind.HOST:
            if host_port is None:
                raise RuntimeFailure("a host-network sandbox needs a host port for execd")
            labels[LABEL_EXECD_PORT] = str(host_port)
            listen = f"tcp:127.0.0.1:{host_port}"
        else:
            listen = f"tcp:127.0.0.1:{self.execd_port}"
        host: dict[str, Any] = {
            "network_mode": self.network.name,
            "mounts": [_bundle_mount(self.bundle), *(volume_mounts or [])],
            "tmpfs": {RUN_DIR: "rw,nosuid,nodev,noexec,mode=755,size=65536k"},
            "security_opt": list(self.security_opt) or None,
            "cap_drop": list(self.cfg.drop_capabilities) or None,
            "pids_limit": self.pids_limit(spec),
            "log_config": LOG_CONFIG,
            "restart_policy": {"Name": "no"},
        }
        if self.engine_runtime:
            host["runtime"] = self.engine_runtime
        elif self.network.own_namespace:
            # Polling execd's port before it binds can then never self-connect onto it and
            # hold it (see runtime/tcp_connect.py). gVisor's netstack (engine_runtime)
            # takes no host sysctls: execd's bind retry covers it there.
            host["sysctls"] = {"net.ipv4.ip_local_reserved_ports": str(self.execd_port)}
        if can_lower_oom_score_adj():  # as in the OCI backend: needs CAP_SYS_RESOURCE
            host["oom_score_adj"] = EXECD_OOM_SCORE_ADJ
        if spec.memory_bytes is not None:
            host["mem_limit"] = spec.memory_bytes
            if self.swap_limit:
                host["memswap_limit"] = spec.memory_bytes  # no escape into swap
        if spec.cpu_cores is not None:
            host["nano_cpus"] = max(NANO // 100, int(spec.cpu_cores * NANO))
        if pooled:
            host["cpu_shares"] = WARM_CPU_SHARES
        kwargs: dict[str, Any] = {
            "image": image.id,
            "name": container_name(spec.sandbox_id),
            "entrypoint": self.execd_argv(spec, image, listen, pooled),
            "command": [],
            "user": "0:0",
            "working_dir": image.working_dir or WORKSPACE,
            "environment": self.environment(spec),
            "labels": labels,
            "host_config": api.create_host_config(**host),
            "stdin_open": False,
            "tty": False,
        }
        if self.network.own_namespace:
            kwargs["hostname"] = hostname(spec.sandbox_id)
        return kwargs


def bundles_named(containers: list[dict[str, Any]]) -> set[Path]:
    """The execd bundles bound into ``containers`` (entries of the engine's container list,
    in any state: a stopped one mounts its bundle again if started)."""
    return {Path(m["Source"]) for c in containers for m in c.get("Mounts") or []
            if m.get("Destination") == MOUNT_POINT and isinstance(m.get("Source"), str)}


def _bundle_mount(bundle: ExecdBundle) -> Mount:
    return Mount(target=bundle.mount_point, source=str(bundle.path), type="bind",
                 read_only=True)
