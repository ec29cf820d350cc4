"""Endpoint host ports: a configured range apart from the kernel's ephemeral ports."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from sandlot.config import ServerConfig
from sandlot.server.endpoint_ports import PortRange, bind_in_range, ephemeral_range


def test_parse_and_refuse() -> None:
    assert PortRange.parse("20000-32767") == PortRange(20000, 32767)
    assert PortRange.parse("0") is None and PortRange.parse("") is None
    for bad in ("20000", "a-b", "80-90", "30000-20000", "60000-70000"):
        with pytest.raises(ValueError):
            PortRange.parse(bad)
    with pytest.raises(ValidationError, match="endpoint_ports"):
        ServerConfig(endpoint_ports="1-2")


def test_the_default_range_is_below_the_kernels_ephemeral_ports() -> None:
    default = PortRange.parse(ServerConfig().endpoint_ports)
    kernel = ephemeral_range()
    assert default is not None and kernel is not None
    assert not default.overlaps(kernel), (default, kernel)


def test_binds_inside_the_range_and_skips_taken_and_held_ports() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        taken = blocker.getsockname()[1]
        blocker.listen()
        # A one-port range that is taken: the kernel's choice instead, never the taken port.
        fallback = bind_in_range("127.0.0.1", PortRange(taken, taken), set())
        with fallback:
            assert fallback.getsockname()[1] != taken
    free = PortRange(29000, 29003)
    got = []
    for _ in range(3):
        sock = bind_in_range("127.0.0.1", free, set(got))
        got.append(sock.getsockname()[1])
        sock.close()  # closed but "held": the next one must still pick another port
    assert len(set(got)) == 3 and all(29000 <= p <= 29003 for p in got)
