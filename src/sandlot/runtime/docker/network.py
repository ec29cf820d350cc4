"""``[docker] network_mode`` and how the server reaches a port inside a sandbox under it.

- ``bridge`` / a user-defined network: the container has its own network namespace on that
  network; ``none``: its own namespace with loopback only. The server enters that namespace
  (setns through ``/proc/<pid>/ns/net``, the OCI backend's connector) and connects to
  ``127.0.0.1:<port>``: no host path the sandbox can write is followed, execd can listen on
  the sandbox's loopback only (other containers on the network never reach it), and servers
  bound to loopback inside the sandbox are reachable like those on all addresses.
- ``host``: the container shares the host's network; its ports are host ports. execd then
  listens on a loopback port of the host taken from ``[docker] port_range_min..max``
  (44772 itself could serve one sandbox only) and recorded in a container label.
"""

from __future__ import annotations

import enum
import random
import socket
from dataclasses import dataclass

from sandlot.errors import RuntimeFailure


class NetworkKind(enum.Enum):
    HOST = "host"
    BRIDGE = "bridge"
    NONE = "none"
    USER = "user"  # a user-defined network, by name


@dataclass(frozen=True)
class NetworkMode:
    kind: NetworkKind
    name: str  # what the engine is given as NetworkMode

    @classmethod
    def parse(cls, value: str) -> NetworkMode:
        name = value.strip()
        if not name:
            raise RuntimeFailure('[docker] network_mode is empty; use "bridge", "none", "host" '
                                 "or the name of a user-defined network")
        if name.startswith("container:"):
            raise RuntimeFailure(
                f"[docker] network_mode {name!r} is not supported: sandboxes sharing another "
                "container's network would share their ports; use bridge, none, host or a "
                "user-defined network"
            )
        for kind in (NetworkKind.HOST, NetworkKind.BRIDGE, NetworkKind.NONE):
            if name == kind.value:
                return cls(kind, name)
        return cls(NetworkKind.USER, name)

    @property
    def own_namespace(self) -> bool:
        return self.kind != NetworkKind.HOST


class HostPortAllocator:
    """Free loopback ports of the host in ``[low, high]``, for execd under ``host`` mode."""

    def __init__(self, low: int, high: int) -> None:
        if low > high:
            raise RuntimeFailure(
                f"[docker] port_range_min ({low}) is above port_range_max ({high})"
            )
        self.low, self.high = low, high
        self.taken: set[int] = set()

    def allocate(self, attempts: int = 200) -> int:
        for _ in range(attempts):
            port = random.randint(self.low, self.high)
            if port in self.taken:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self.taken.add(port)
            return port
        raise RuntimeFailure(
            f"no free host port in [docker] port_range_min..port_range_max "
            f"({self.low}-{self.high}) for the sandbox's execd"
        )

    def release(self, port: int | None) -> None:
        if port is not None:
            self.taken.discard(port)
