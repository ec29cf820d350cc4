"""``[network] mode = "host"``: sandboxes share the server's network namespace.

Offered only with the explicit opt-in ``[network] allow_host_mode = true`` and announced
loudly (a warning at every start and in ``sandlot doctor``): nothing fences such sandboxes
(no default deny, no egress policy, no separation between sandboxes or from services on the
host's loopback). Each sandbox's execd listens on a loopback port of its own (persisted in
its folder) since sandboxes no longer have a loopback each. Only the OCI runtime with runc
can do this: gVisor's netstack needs a namespace of its own, and the docker and kubernetes
runtimes take their network from ``[docker] network_mode`` and the cluster.
"""

from __future__ import annotations

import socket
from pathlib import Path

from sandlot.config import Config

OPT_IN_KEY = "allow_host_mode"
PORT_FILE = "execd.port"
WARNING = (
    '[network] mode = "host": sandboxes share this server\'s network namespace. Nothing is '
    "fenced: no default deny (cloud metadata, private ranges and every service on this "
    "host's loopback are reachable), no egress policy (a create or change asking for one is "
    "refused), and sandboxes can reach and disturb each other's ports. Use it only for "
    'trusted workloads; mode = "isolated" is the default.'
)


def refusal(cfg: Config) -> str | None:
    """Why this configuration cannot run in mode host (None: it can, with the warning)."""
    if not cfg.network.allow_host_mode:
        return ('[network] mode = "host" gives sandboxes this host\'s network unfenced; it '
                f"needs the explicit opt-in [network] {OPT_IN_KEY} = true (see "
                'docs/network.md), or use "isolated" (the default) or "none"')
    if cfg.runtime.type != "oci":
        return (f'[network] mode = "host" applies to [runtime] type = "oci" only; the '
                f"{cfg.runtime.type} runtime's network is configured by its own settings")
    if cfg.secure_runtime.type:
        return ('[network] mode = "host" is not available with gVisor: its network stack '
                "needs a namespace of its own")
    return None


def allocate_port(root: Path) -> int:
    """A free loopback port for a sandbox's execd, kept in the sandbox's folder."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    (root / PORT_FILE).write_text(f"{port}\n")
    return port


def execd_port(root: Path) -> int | None:
    try:
        return int((root / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None
