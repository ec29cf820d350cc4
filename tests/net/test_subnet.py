"""The start-up check of ``[network] subnet`` against the host's routes and addresses,
inside a namespace the test creates (never the machine's own)."""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess

import pytest

from sandlot.net.addressing import overlapping_routes
from tests.net.testhosts import nsenter, thread_in_netns


def test_overlapping_subnet_is_found_and_own_leases_are_not() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    ns = "sltn" + secrets.token_hex(3) + "o"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                    ["ip", "link", "set", "d0", "up"],
                    ["ip", "link", "set", "d1", "up"],
                    ["ip", "addr", "add", "100.88.7.1/24", "dev", "d0"],
                    ["ip", "addr", "add", "100.89.0.5/30", "dev", "d1"]):
            subprocess.run(nsenter(ns, *cmd), check=True)
        with thread_in_netns(ns):
            clash = overlapping_routes(ipaddress.IPv4Network("100.88.0.0/16"), set())
            assert any("100.88.7.0/24" in c for c in clash), clash
            assert overlapping_routes(ipaddress.IPv4Network("100.90.0.0/16"), set()) == []
            own = {ipaddress.IPv4Network("100.89.0.4/30")}
            assert overlapping_routes(ipaddress.IPv4Network("100.89.0.0/16"), own) == []
            assert overlapping_routes(ipaddress.IPv4Network("100.89.0.0/16"), set())
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)
