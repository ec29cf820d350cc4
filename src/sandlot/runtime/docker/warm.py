"""What claiming a warm container changes: limits (through the engine), hostname, environment.

A warm container runs execd ``--pooled`` with no limits but the pids cap, a low CPU weight
and the hostname of its pool id. The claim gives it the sandbox's limits with the engine's
own ``update`` (so ``docker inspect`` stays true), its hostname (set in the container's UTS
namespace, as the OCI backend does, and in the engine's hostname and hosts files), and hands
execd the environment a cold start would have had.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sandlot.runtime.base import SandboxSpec
from sandlot.runtime.docker.container import Plan, hostname
from sandlot.runtime.docker.images import EngineImage
from sandlot.runtime.oci.claimops import CPU_PERIOD_US, DEFAULT_CPU_SHARES, set_hostname
from sandlot.runtime.oci.spec import DEFAULT_PATH


def limits(spec: SandboxSpec, swap_limit: bool) -> dict[str, Any]:
    """``update_container`` arguments for ``spec``'s cpu and memory."""
    args: dict[str, Any] = {"cpu_shares": DEFAULT_CPU_SHARES}
    if spec.cpu_cores is not None:
        args["cpu_period"] = CPU_PERIOD_US
        args["cpu_quota"] = max(1000, int(spec.cpu_cores * CPU_PERIOD_US))
    if spec.memory_bytes is not None:
        args["mem_limit"] = spec.memory_bytes
        if swap_limit:
            args["memswap_limit"] = spec.memory_bytes
    return args


def _same_namespace(pid: int, kind: str) -> bool:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino


def set_identity(attrs: dict[str, Any], sandbox_id: str) -> None:
    """The sandbox's hostname, in the container and in the engine's files for it.

    Never in the host's own UTS namespace (``host`` network mode shares it): there the
    container has the host's name anyway. Run on a worker thread (it setns()es).
    """
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    if pid <= 0:
        raise ProcessLookupError("the warm container has no init process")
    if _same_namespace(pid, "uts"):
        return
    old = str((attrs.get("Config") or {}).get("Hostname") or "")
    new = hostname(sandbox_id)
    set_hostname(pid, new)
    # The engine's own files (bind-mounted into the container): rewritten in place, a new
    # inode would not be seen inside.
    hostname_path, hosts_path = attrs.get("HostnamePath"), attrs.get("HostsPath")
    if hostname_path and Path(hostname_path).is_file():
        Path(hostname_path).write_text(new + "\n")
    if hosts_path and Path(hosts_path).is_file() and old:
        path = Path(hosts_path)
        path.write_text(renamed_hosts(path.read_text(), old, new))


def renamed_hosts(text: str, old: str, new: str) -> str:
    """An /etc/hosts text with host name ``old`` replaced by ``new``."""
    lines = []
    for line in text.splitlines():
        fields = line.split()
        if old in fields and not line.lstrip().startswith("#"):
            line = "\t".join(new if f == old else f for f in fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


def claim_env(spec: SandboxSpec, image: EngineImage, plan: Plan) -> dict[str, str]:
    """The workload's environment as a cold start gives it: defaults, image, spec."""
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": hostname(spec.sandbox_id)}
    for item in image.env:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    env.update(spec.env)
    for private in (*plan.bundle.env(), "SANDLOT_EXECD_TOKEN", "SANDLOT_EXECD_PRIVATE_ENV"):
        env.pop(private, None)
    return env
