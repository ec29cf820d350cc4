"""Where a sandbox's download throughput goes: the network path alone, variant by variant.

Builds the test namespaces of ``tests/net`` (the only way out leads to the test hosts at
198.51.100.0/24; nothing is added to the machine's own namespace), sets up one sandbox
network with ``NetworkManager`` into a plain namespace (no container: no cgroup, no CPU
limit), and downloads the test host's 100 MiB file with the SAME curl binary from the
server's namespace (the baseline) and from the sandbox namespace, rounds interleaved so that
load drift hits both alike. Variants isolate the parts of the path:

- ``sandlot``: the veth, routing, the shared nft table (verdict map, the sandbox's chain,
  conntrack, masquerade) as a create makes them;
- ``no-nft``: the same veth and routes with the sandlot table removed (no filtering, no
  conntrack from sandlot, no NAT: the test hosts' namespace gets a route back to the
  subnet instead), so the difference to ``sandlot`` is nftables' per-packet cost;
- ``cgroup``: the ``sandlot`` path with curl run in a cgroup like a sandbox's (v1 ``cpu``
  controller under ``sandlot/``, 1 CPU quota): the scheduling a sandbox's process gets;
  ``cgroup-nq`` the same cgroup without the quota.

Run as root from the repository root:

    PYTHONPATH=. .venv/bin/python tools/measure_throughput.py --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.net.testhosts import HOST, nsenter, sh, test_network

CURL = shutil.which("curl") or "curl"
CPU_V1 = Path("/sys/fs/cgroup/cpu")


def _p90(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.9))]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its softirq work included: veth delivery runs there)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _curl(prefix: list[str], server_pid: int) -> tuple[float, float, float]:
    """MB/s, then the CPU seconds of the client and of the test host's HTTP server."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = _cpu_seconds(server_pid)
    out = subprocess.run([*prefix, CURL, "-sS", "-o", "/dev/null", "-w", "%{speed_download}",
                          f"http://{HOST}/big.bin"], capture_output=True, text=True, timeout=180,
                         check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(out) / 1e6, client, _cpu_seconds(server_pid) - server_before


def _cgroup_prefix(name: str, quota: bool) -> list[str]:
    """A wrapper that runs a command in a v1 cpu cgroup like a sandbox's (1 CPU quota)."""
    group = CPU_V1 / "sandlot" / name
    group.mkdir(parents=True, exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text("100000" if quota else "-1")
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"]


def _summary(label: str, values: list[float], unit: str) -> str:
    return (f"{label:<34} p50 {statistics.median(values):8.1f} {unit}  "
            f"p90 {_p90(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f}")


async def _measure(rounds: int, variants: list[str], server_ns: str, server_pid: int) -> None:
    # Imported here, in the process that runs inside the server's namespace: libnftables
    # binds its netlink socket to the namespace the context is made in.
    from sandlot.config import Config
    from sandlot.net import firewall
    from sandlot.net.manager import NetworkManager
    from sandlot.net.policy import EgressPolicy

    data = Path(tempfile.mkdtemp(prefix="sltp-"))
    sbx_ns = "sltp" + secrets.token_hex(3)
    sh("ip", "netns", "add", sbx_ns)
    cfg = Config.model_validate({"network": {"mode": "isolated", "dns_servers": [HOST]}})
    mgr = await NetworkManager.open(cfg, data)
    group = "sltp-" + secrets.token_hex(3)
    try:
        addr = await mgr.setup("tp-" + sbx_ns, Path(f"/run/netns/{sbx_ns}"))
        print(f"sandbox {addr.address} via {addr.host_ifname}; curl {CURL}")
        in_sbx = nsenter(sbx_ns)
        in_srv = nsenter(server_ns)
        results: dict[str, list[float]] = {"host": []}
        ratios: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        rules = firewall.SandboxRules(addr, mgr.subnet, [], True)
        for v in variants:
            results[v] = []
            ratios[v] = []
        for r in range(rounds):
            for v in variants:
                prefix = in_sbx
                if v == "no-nft":
                    firewall.run(f"delete table inet {firewall.TABLE}\n")
                elif v.startswith("cgroup") and not CPU_V1.is_dir():
                    raise SystemExit("the cgroup variants need the cgroup v1 cpu controller")
                elif v.startswith("cgroup"):
                    prefix = [*_cgroup_prefix(group, v == "cgroup"), *in_sbx]
                host, hc, hs = _curl(in_srv, server_pid)
                try:
                    got, gc, gs = _curl(prefix, server_pid)
                finally:
                    if v == "no-nft":
                        firewall.ensure_table()
                        firewall.run(rules.install(EgressPolicy()))
                results["host"].append(host)
                results[v].append(got)
                ratios[v].append(100 * got / host)
                cpu.setdefault("host client", []).append(hc * 1000)
                cpu.setdefault("host server", []).append(hs * 1000)
                cpu.setdefault(f"{v} client", []).append(gc * 1000)
                cpu.setdefault(f"{v} server", []).append(gs * 1000)
                print(f"round {r + 1} {v:<8} host {host:7.1f} MB/s (cpu client {hc * 1000:4.0f}"
                      f" server {hs * 1000:4.0f} ms)  sandbox {got:7.1f} MB/s (cpu client "
                      f"{gc * 1000:4.0f} server {gs * 1000:4.0f} ms) ({100 * got / host:5.1f} %)",
                      flush=True)
        print()
        for name, values in results.items():
            print(_summary(f"{name} download", values, "MB/s"))
        for name, values in ratios.items():
            print(_summary(f"{name} / host (same round)", values, "% "))
        for name, values in cpu.items():
            print(_summary(f"CPU per 100 MiB, {name}", values, "ms"))
    finally:
        await mgr.teardown("tp-" + sbx_ns)
        await mgr.close()
        sh("ip", "netns", "delete", sbx_ns, check=False)
        with_group = CPU_V1 / "sandlot" / group
        if with_group.exists():
            with_group.rmdir()
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="sandlot,no-nft,cgroup")
    parser.add_argument("--inner", nargs=2, metavar=("SERVER_NS", "SERVER_PID"),
                        help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.inner:  # the measuring process, started inside the server's namespace
        if os.readlink("/proc/self/ns/net") == os.readlink(f"/proc/{os.getppid()}/ns/net"):
            raise SystemExit("refusing to run outside the test network")
        asyncio.run(_measure(ns.rounds, ns.variants.split(","), ns.inner[0],
                             int(ns.inner[1])))
        return 0
    work = Path(tempfile.mkdtemp(prefix="sltp-"))
    try:
        with test_network(work) as lab:
            # The hosts' namespace routes replies to the subnet back (only the no-nft
            # variant, which has no masquerade, needs it; inside the test namespaces).
            sh(*nsenter(lab.hosts_ns, "ip", "route", "add", "100.88.0.0/16", "via",
                        "198.51.100.2"))
            return subprocess.run(nsenter(
                lab.server_ns, sys.executable, *sys.argv, "--inner", lab.server_ns,
                str(lab.procs[0].pid))).returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", ".")
    raise SystemExit(main())
