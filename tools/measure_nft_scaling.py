"""How a sandbox's nftables set-up and removal scale with the number of sandboxes.

Each sandbox has one chain (and one set, and map entries) in the shared table
(``sandlot.net.firewall``), applied through libnftables, which reads the chains and sets it
needs before every command. This installs N sandboxes one by one, as N creates would, and
prints the cost of each step of the way (p50 and p90 per decile), then of a policy change
with all N present, then of removing them. Run it as root: it re-executes itself in a new, empty
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


def _p90(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.9))]


def _measure(n: int, with_policy: bool) -> None:
    policy = parse_policy({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "10.1.2.0/24"},
    ]} if with_policy else None)
    costs = []
    firewall.ensure_table()
    addrs = [SandboxAddress(f"sbx-{i}", i,
                            ipaddress.IPv4Network(f"100.88.{i // 64}.{(i % 64) * 4}/30"))
             for i in range(n)]
    for addr in addrs:
        rules = firewall.SandboxRules(addr, SUBNET, [], enforce_ips=True)
        t0 = time.perf_counter()
        firewall.run(rules.install(policy))
        costs.append((time.perf_counter() - t0) * 1000)
    step = max(1, n // 10)
    print(f"create (a chain per sandbox in the shared table), "
          f"{'with' if with_policy else 'no'} policy:")
    for lo in range(0, n, step):
        part = costs[lo:lo + step]
        print(f"  sandboxes {lo + 1:4d}-{lo + len(part):4d}: p50 {statistics.median(part):6.2f} ms"
              f"  p90 {_p90(part):6.2f} ms  max {max(part):6.2f} ms")
    changes = []
    other = parse_policy({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "10.3.0.0/16"}]})
    for addr in addrs[:: max(1, n // 20)]:
        rules = firewall.SandboxRules(addr, SUBNET, [], enforce_ips=True)
        t0 = time.perf_counter()
        firewall.run(rules.update(other))
        changes.append((time.perf_counter() - t0) * 1000)
    print(f"policy change (default and CIDR rules) with {n} present: p50 "
          f"{statistics.median(changes):.2f} ms, p90 {_p90(changes):.2f} ms")
    deletes = []
    for addr in reversed(addrs):
        t0 = time.perf_counter()
        firewall.remove_sandbox(addr.container_id, addr)
        deletes.append((time.perf_counter() - t0) * 1000)
    print(f"delete: first (of {n}) {deletes[0]:.2f} ms, p50 {statistics.median(deletes):.2f} ms, "
          f"last {deletes[-1]:.2f} ms")
    assert firewall.sandbox_chains() == []
    assert firewall.remove_table_if_unused()


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
