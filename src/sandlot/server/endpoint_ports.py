"""Which host ports direct endpoints listen on: a range apart from the kernel's ephemeral one.

A sandbox's endpoint keeps its host port across a server restart (the store remembers it
and the new server binds it again), so clients holding an endpoint URL keep working. While
the server is down nothing holds the port, and a port from the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, where ``bind(0)`` picks) can be taken meanwhile by any
outgoing connection on the host. Ports below that range are never handed out implicitly,
so endpoints take theirs from ``[server] endpoint_ports`` (default 20000-32767), and a
range that overlaps the ephemeral one is warned about at start.
"""

from __future__ import annotations

import logging
import random
import socket
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> PortRange | None:
        """``"LOW-HIGH"``; ``""`` or ``"0"``: None (any free port, the kernel's choice)."""
        text = text.strip()
        if text in ("", "0"):
            return None
        low_s, sep, high_s = text.partition("-")
        if not sep or not low_s.strip().isdigit() or not high_s.strip().isdigit():
            raise ValueError(f"endpoint_ports must be 'LOW-HIGH' (e.g. 20000-32767), not {text!r}")
        low, high = int(low_s), int(high_s)
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"endpoint_ports {text!r}: need 1024 <= LOW <= HIGH <= 65535")
        return cls(low, high)

    def overlaps(self, other: PortRange) -> bool:
        return self.low <= other.high and other.low <= self.high


def ephemeral_range() -> PortRange | None:
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return PortRange(low, high)


def warn_if_ephemeral(ports: PortRange | None) -> None:
    kernel = ephemeral_range()
    if kernel is None:
        return
    if ports is None or ports.overlaps(kernel):
        log.warning("[server] endpoint_ports %s overlaps the kernel's ephemeral ports %d-%d: "
                    "an outgoing connection may take an endpoint's port while the server is "
                    "down, and the endpoint then moves to another port after the restart",
                    f"{ports.low}-{ports.high}" if ports else "(any)", kernel.low, kernel.high)


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to ``host``:``port`` (``port`` 0: the kernel picks)."""
    return _bind(_resolve(host), port)


def bind_in_range(host: str, ports: PortRange | None, held: set[int]) -> socket.socket:
    """A socket bound to a free port of ``ports`` (not one of ``held``), tried from a random
    place on; the kernel's choice when there is no range or every port of it is taken."""
    where = _resolve(host)  # once: the event loop runs this, and a host name may be looked up
    if ports is not None:
        size = ports.high - ports.low + 1
        start = random.randrange(size)
        for i in range(size):
            port = ports.low + (start + i) % size
            if port in held:
                continue
            try:
                return _bind(where, port)
            except OSError:
                continue
        log.warning("every port of [server] endpoint_ports %d-%d is taken; using any free one",
                    ports.low, ports.high)
    return _bind(where, 0)


Resolved = tuple[socket.AddressFamily, socket.SocketKind, int, str]


def _resolve(host: str) -> Resolved:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, kind, proto, str(address[0])


def _bind(where: Resolved, port: int) -> socket.socket:
    family, kind, proto, address = where
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock
