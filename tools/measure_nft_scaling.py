"""How a sandbox's nftables set-up and removal scale with the number of sandboxes.

Each sandbox has one table of its own (``sandlot.net.firewall``), applied through
libnftables, which reads the ruleset it needs before every command. This creates N tables
one by one, as N creates would, and prints the cost of each step of the way (p50 per
decile), then of deleting them. Run it as root: it re-executes itself in a new, empty
network namespace (``unshare --net``), so the host's own ruleset is not touched and no
packet is sent.

    .venv/bin/python tools/measure_nft_scaling.py --n 100
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import sys
import time

from sandlot.net import firewall
from sandlot.net.addressing import SandboxAddress
from sandlot.net.policy import parse_policy

SUBNET = ipaddress.IPv4Network("100.88.0.0/16")


def _measure(n: int, with_policy: bool) -> None:
    policy = parse_policy({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "10.1.2.0/24"},
    ]} if with_policy else None)
    costs = []
    for i in range(n):
        net = ipaddress.IPv4Network(f"100.88.{i // 64}.{(i % 64) * 4}/30")
        addr = SandboxAddress(f"sbx-{i}", i, net)
        t0 = time.perf_counter()
        firewall.run(firewall.sandbox_table(addr, SUBNET, [], policy, enforce_ips=True))
        costs.append((time.perf_counter() - t0) * 1000)
    step = max(1, n // 10)
    print(f"create (one table per sandbox), {'with' if with_policy else 'no'} policy:")
    for lo in range(0, n, step):
        part = costs[lo:lo + step]
        print(f"  sandboxes {lo + 1:4d}-{lo + len(part):4d}: p50 {statistics.median(part):6.2f} ms"
              f"  max {max(part):6.2f} ms")
    deletes = []
    for i in reversed(range(n)):
        t0 = time.perf_counter()
        firewall.delete_table(f"sbx-{i}")
        deletes.append((time.perf_counter() - t0) * 1000)
    print(f"delete: first (of {n}) {deletes[0]:.2f} ms, p50 {statistics.median(deletes):.2f} ms, "
          f"last {deletes[-1]:.2f} ms")
    assert firewall.tables() == []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--policy", action="store_true", help="each sandbox with a deny policy")
    ns = parser.parse_args()
    if os.environ.get("SANDLOT_NFT_MEASURE_INNER") != "1":
        env = {**os.environ, "SANDLOT_NFT_MEASURE_INNER": "1"}
        os.execvpe("unshare", ["unshare", "--net", sys.executable, *sys.argv], env)
    _measure(ns.n, ns.policy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
