"""Addresses of sandboxes: one /30 of ``[network] subnet`` per sandbox, leased on disk.

Each sandbox gets its own point-to-point link: ``.1`` on the host side (its gateway and DNS
filter) and ``.2`` inside. A lease is a file ``<leases>/<index>`` holding the container id,
created with O_EXCL (so two creates never get one address) and kept across restarts.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute

from sandlot.errors import RuntimeFailure

IFNAME_PREFIX = "slv"  # host-side veth names: slv + 12 hex digits (IFNAMSIZ is 16)


@dataclass(frozen=True)
class SandboxAddress:
    container_id: str
    index: int
    network: ipaddress.IPv4Network

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.network.network_address + 1

    @property
    def address(self) -> ipaddress.IPv4Address:
        return self.network.network_address + 2

    @property
    def host_ifname(self) -> str:
        return host_ifname(self.container_id)


def host_ifname(container_id: str) -> str:
    return IFNAME_PREFIX + hashlib.sha256(container_id.encode()).hexdigest()[:12]


def parse_subnet(raw: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(raw, strict=True)
    except ValueError as exc:
        raise RuntimeFailure(f"[network] subnet {raw!r} is not a network: {exc}") from None
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > 29:
        raise RuntimeFailure(f"[network] subnet {raw!r} must be an IPv4 network of /29 or larger")
    return net


def overlapping_routes(subnet: ipaddress.IPv4Network,
                       own: set[ipaddress.IPv4Network]) -> list[str]:
    """Routes and addresses of this namespace (any table) that overlap ``subnet``, except the
    ``own`` /30s (sandboxes this data dir leased, kept running across a restart).

    A default route overlaps everything and is not a conflict.
    """
    found: list[str] = []
    with IPRoute() as ipr:
        for route in ipr.get_routes(family=2):
            dst = route.get("RTA_DST")
            plen = route["dst_len"]
            if dst is None or plen == 0:
                continue
            net = ipaddress.IPv4Network(f"{dst}/{plen}", strict=False)
            if not net.overlaps(subnet) or any(net.subnet_of(o) for o in own):
                continue
            found.append(str(net))
        for addr in ipr.get_addr(family=2):
            ip = ipaddress.ip_interface(f"{addr.get('IFA_ADDRESS')}/{addr['prefixlen']}")
            ifname = addr.get("IFA_LABEL") or ""
            if ip.ip in subnet and not any(ip.ip in o for o in own):
                found.append(f"{ip} on {ifname}")
    return sorted(set(found))


class Leases:
    """The /30 leases of one data dir."""

    def __init__(self, root: Path, subnet: ipaddress.IPv4Network) -> None:
        self.root = root
        self.subnet = subnet
        self.capacity = subnet.num_addresses // 4
        root.mkdir(parents=True, exist_ok=True)
        self._by_id: dict[str, SandboxAddress] = {}
        for f in root.iterdir():
            if f.name.isdigit():
                with contextlib.suppress(OSError):
                    self._remember(int(f.name), f.read_text().strip())
        self._next = 1

    def _remember(self, index: int, container_id: str) -> SandboxAddress:
        net = ipaddress.IPv4Network((int(self.subnet.network_address) + 4 * index, 30))
        addr = SandboxAddress(container_id, index, net)
        self._by_id[container_id] = addr
        return addr

    def get(self, container_id: str) -> SandboxAddress | None:
        return self._by_id.get(container_id)

    def all(self) -> list[SandboxAddress]:
        return list(self._by_id.values())

    def acquire(self, container_id: str) -> SandboxAddress:
        known = self._by_id.get(container_id)
        if known is not None:
            return known
        for step in range(self.capacity - 1):
            index = 1 + (self._next - 1 + step) % (self.capacity - 1)
            try:
                fd = os.open(self.root / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(container_id)
            self._next = index + 1
            return self._remember(index, container_id)
        raise RuntimeFailure(
            f"no free sandbox address in [network] subnet {self.subnet} "
            f"({self.capacity - 1} sandboxes at most)"
        )

    def release(self, container_id: str) -> None:
        addr = self._by_id.pop(container_id, None)
        if addr is not None:
            (self.root / str(addr.index)).unlink(missing_ok=True)
