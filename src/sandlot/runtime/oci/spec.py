"""The OCI runtime spec (config.json) of a sandbox: namespaces, mounts, limits, hardening."""

from __future__ import annotations

import functools
import resource
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandlot.images.model import Image
from sandlot.runtime.base import SandboxSpec
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.oci import cgroups
from sandlot.runtime.oci.seccomp import seccomp_profile

# A tmpfs of the sandbox's own (never a host directory: the server must not follow anything
# the sandbox can write). execd listens on TCP in the sandbox's network namespace instead.
RUN_DIR = "/run/sandlot"
# Under gVisor execd leaves idle connections for the client to close (see execd_client).
GVISOR_KEEP_ALIVE = 3600
ENTRYPOINT_LOG = f"{RUN_DIR}/entrypoint.log"
WORKSPACE = "/workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CPU_PERIOD_US = 100_000
USERNS_SIZE = 65536
# execd (PID 1) all but opts out of the OOM killer: if it were picked, the whole sandbox would
# go. Not -1000 (never killable): a leak in execd itself must still end somewhere. Children
# inherit the value; the code service resets its kernels to 0 (execd/code/oom.py), so a kernel
# over the memory limit is always chosen before execd. (On Linux >= 5.9 processes with equal
# adjustments are still ranked by size, so children that keep -999 are no worse off than before.)
# Lowering the value needs CAP_SYS_RESOURCE, which runc only has when this server has it.
EXECD_OOM_SCORE_ADJ = -999
CAP_SYS_RESOURCE_BIT = 24

# Docker's default capability set minus NET_RAW (raw sockets: spoofing, ARP tricks) and
# MKNOD (device nodes); execd runs as root inside and needs the file-ownership ones.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def env_dict(items: Iterable[str]) -> dict[str, str]:
    """An OCI / image ``env`` list (``NAME=value`` strings) as a dict; items without ``=``
    are left out."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


def _env(spec: SandboxSpec, image: Image, bundle: ExecdBundle) -> list[str]:
    env: dict[str, str] = {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": hostname(spec)}
    env.update(env_dict(image.config.env))
    env.update(spec.env)
    env.update(bundle.env())
    # The token is not among them: it reaches execd through its stdin (see process_args),
    # never through the environment the workload can read back from /proc/1/environ.
    env["SANDLOT_EXECD_PRIVATE_ENV"] = ",".join(bundle.env())
    return [f"{k}={v}" for k, v in env.items()]


@functools.cache
def can_lower_oom_score_adj() -> bool:
    """Whether this process (and so runc) holds CAP_SYS_RESOURCE in its effective set.

    Without it runc cannot write a negative ``oomScoreAdj`` and the container fails to start,
    e.g. when sandlot itself runs in a container that dropped the capability.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE_BIT & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _process_extras() -> dict[str, Any]:
    return {"oomScoreAdj": EXECD_OOM_SCORE_ADJ} if can_lower_oom_score_adj() else {}


def hostname(spec: SandboxSpec) -> str:
    return spec.sandbox_id[:63]


def workdir(image: Image) -> str:
    return image.config.working_dir or WORKSPACE


def process_args(
    spec: SandboxSpec, image: Image, bundle: ExecdBundle, execd_port: int,
    execd_host: str | None = None,
    user: tuple[int, int] | None = None,
    handoff: bool = False,
) -> list[str]:
    """execd as PID 1, then (after ``--``) the user's entrypoint, which execd starts.

    execd listens on the namespace's loopback only: reachable from the host through the
    runtime's ``connect`` and from the workload itself, never from other sandboxes. Under
    gVisor it also listens on ``execd_host``, netstack's end of the access veth (the host
    cannot reach gVisor's loopback).
    ``user``: the image's ``User`` as (uid, gid); execd (which must stay root to manage the
    sandbox) starts the entrypoint and commands as that user unless a request names one.
    ``handoff``: execd also takes the endpoint's client connections the host hands over
    (execd/handoff.py; runc sandboxes in a network namespace of their own).
    """
    listen = ["--listen", f"tcp:127.0.0.1:{execd_port}"]
    if execd_host:
        listen += ["--listen", f"tcp:{execd_host}:{execd_port}",
                   "--keep-alive-timeout", str(GVISOR_KEEP_ALIVE)]
    args = [*bundle.python_argv(), "-m", "sandlot.execd", *listen,
            "--workdir", workdir(image), "--entrypoint-log", ENTRYPOINT_LOG]
    if user is not None:
        args += ["--user", f"{user[0]}:{user[1]}"]
    if handoff:
        args.append("--handoff")
    if spec.execd_token:
        args.append("--token-stdin")  # the runtime writes it into execd's stdin pipe
    if spec.entrypoint:
        args += ["--", *spec.entrypoint]
    return args


def _resources(spec: SandboxSpec, swap_limit: bool) -> dict[str, Any]:
    res: dict[str, Any] = {
        "devices": [{"allow": False, "access": "rwm"}],  # runc adds the standard /dev nodes
        "pids": {"limit": spec.pids_limit},
    }
    if spec.memory_bytes is not None:
        mem: dict[str, int] = {"limit": spec.memory_bytes}
        if swap_limit:
            mem["swap"] = spec.memory_bytes  # memory+swap == memory: no escape into swap
        res["memory"] = mem
    if spec.cpu_cores is not None:
        res["cpu"] = {"quota": max(1000, int(spec.cpu_cores * CPU_PERIOD_US)),
                      "period": CPU_PERIOD_US}
    return res


def _mounts(bundle: ExecdBundle, etc_dir: Path) -> list[dict[str, Any]]:
    nosuid = ["nosuid", "noexec", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": nosuid},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": [*nosuid, "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": nosuid},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*nosuid, "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": [*nosuid, "relatime", "ro"]},
        {"destination": bundle.mount_point, "type": "bind", "source": str(bundle.path),
         "options": ["bind", "ro", "nosuid", "nodev"]},
        {"destination": RUN_DIR, "type": "tmpfs", "source": "tmpfs",
         "options": [*nosuid, "mode=755", "size=65536k"]},
        {"destination": "/etc/hosts", "type": "bind", "source": str(etc_dir / "hosts"),
         "options": ["bind", "rw", "nosuid", "nodev", "noexec"]},
        {"destination": "/etc/hostname", "type": "bind", "source": str(etc_dir / "hostname"),
         "options": ["bind", "rw", "nosuid", "nodev", "noexec"]},
    ]


def build_config(
    spec: SandboxSpec,
    image: Image,
    bundle: ExecdBundle,
    *,
    netns: Path | None,
    etc_dir: Path,
    swap_limit: bool,
    execd_port: int,
    execd_host: str | None = None,
    uid_base: int | None = None,
    user: tuple[int, int] | None = None,
    execd_handoff: bool = False,
) -> dict[str, Any]:
    """The complete config.json for ``spec`` (rootfs is ``rootfs`` next to it).

    ``uid_base``: run in a user namespace whose ids 0..65535 are host ids from ``uid_base``
    on (root inside is an unprivileged host user); None keeps host ids. ``netns`` None:
    the server's own network namespace (``[network] mode = "host"``).
    """
    caps = list(CAPABILITIES)
    # As many open files as the host lets us hand down (raising it needs CAP_SYS_RESOURCE).
    nofile = min(1 << 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": process_args(spec, image, bundle, execd_port, execd_host, user,
                                 execd_handoff),
            "env": _env(spec, image, bundle),
            "cwd": workdir(image),
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
            "noNewPrivileges": True,
            **_process_extras(),
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": hostname(spec),
        "mounts": _mounts(bundle, etc_dir),
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "cgroup"},
                *([{"type": "network", "path": str(netns)}] if netns is not None else []),
            ],
            "cgroupsPath": cgroups.cgroups_path(spec.sandbox_id),
            "resources": _resources(spec, swap_limit),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": seccomp_profile(),
        },
    }
    if uid_base is not None:
        _user_namespace(config, uid_base)
    return config


def _user_namespace(config: dict[str, Any], uid_base: int) -> None:
    linux = config["linux"]
    linux["namespaces"].append({"type": "user"})
    mapping = [{"containerID": 0, "hostID": uid_base, "size": USERNS_SIZE}]
    linux["uidMappings"] = mapping
    linux["gidMappings"] = list(mapping)
    # sysfs cannot be mounted from a user namespace that does not own the network namespace
    # (created by the host): a read-only bind of the host's /sys shows the same.
    for m in config["mounts"]:
        if m["destination"] == "/sys":
            m.update(type="bind", source="/sys",
                     options=["rbind", "nosuid", "noexec", "nodev", "ro"])
