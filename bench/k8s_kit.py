"""The Kubernetes the ``kubernetes`` benchmark measures on: a running kit cluster, or one it
starts itself.

``SANDLOT_BENCH_K8S_DIR`` names a kit cluster that already runs (``shared/k8s/up.sh DIR``;
left running). Otherwise a full run starts one from the kit beside the checkout (the
``shared/k8s`` folder of a parent directory, or ``SANDLOT_K8S_KIT``), in a directory under
/tmp, and stops and removes it afterwards, as the test suite does: a newcomer's first
``make bench`` then measures the kubernetes rows instead of skipping them. Needs root; the
kit's cluster uses one fixed bridge, so a kit cluster already running (the test suite's, say)
is not started beside: the rows say so instead.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
KIT_BRIDGE = "sltk8s0"  # shared/k8s/up.sh's bridge: present while any kit cluster runs
UP_TIMEOUT = 600.0
# The kit's kubelet runs in the host's network namespace and writes iptables chains there
# (KUBE-FIREWALL on INPUT and OUTPUT, a nat POSTROUTING hook) that the kit's down.sh leaves:
# every later loopback packet then went through conntrack and those chains.
KUBE_CHAIN_PREFIX = "KUBE-"
IPTABLES_TABLES = ("filter", "nat", "mangle")
# Each iptables command with the nft family its iptables-nft tables live in (IPv6 too: a
# kubelet on a host with IPv6 writes the same chains there).
IPTABLES_FAMILIES = (("iptables", "ip"), ("ip6tables", "ip6"))
FIREWALL_SNAPSHOT = ".host-firewall-before.json"


class NoCluster(Exception):
    """Why there is no cluster to measure on (the rows' skip reason)."""


def find_kit() -> Path | None:
    named = os.environ.get("SANDLOT_K8S_KIT")
    if named:
        return Path(named)
    for parent in REPO_ROOT.parents:
        candidate = parent / "shared" / "k8s"
        if (candidate / "up.sh").exists():
            return candidate
    return None


def start_kit(kit: Path, prefix: str) -> Path:
    """Start a cluster with ``kit``'s ``up.sh`` in a new directory under /tmp and return it;
    on failure stop what started, remove the directory and raise ``RuntimeError`` with the
    script's output. Blocks for the 20-40 s the start takes."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    snapshot_firewall(work)
    proc = subprocess.run([str(kit / "up.sh"), str(work)], capture_output=True, text=True,
                          timeout=UP_TIMEOUT, check=False)
    if proc.returncode != 0:
        stop_kit(kit, work)
        raise RuntimeError(f"{kit}/up.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return work


def stop_kit(kit: Path, work: Path) -> None:
    """Stop the cluster ``start_kit`` started in ``work`` and remove the directory."""
    subprocess.run([str(kit / "down.sh"), str(work)], capture_output=True, check=False,
                   timeout=300)
    remove_kubelet_firewall(work)
    # rm(1): far faster than shutil.rmtree on the node's unpacked images; and it stays on
    # this file system should down.sh have left a mount behind
    subprocess.run(["rm", "-rf", "--one-file-system", str(work)], capture_output=True,
                   check=False, timeout=600)


def _iptables_lines(table: str, command: str = "iptables") -> list[str] | None:
    """``table``'s chain (``:NAME ...``) and rule (``-A ...``) lines; None without
    ``command`` (``iptables`` or ``ip6tables``)."""
    if shutil.which(f"{command}-save") is None:
        return None
    proc = subprocess.run([f"{command}-save", "-t", table], capture_output=True, text=True,
                          check=False, timeout=30)
    if proc.returncode != 0:
        return None
    return [line for line in proc.stdout.splitlines() if line.startswith((":", "-A "))]


def _nft_tables() -> list[str]:
    if shutil.which("nft") is None:
        return []
    proc = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                          check=False, timeout=30)
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith("table ")]


def snapshot_firewall(work: Path) -> None:
    """Record the host's iptables chains and rules and nft tables before the kit starts."""
    state: dict[str, object] = {
        command: {t: _iptables_lines(t, command) or [] for t in IPTABLES_TABLES}
        for command, _ in IPTABLES_FAMILIES}
    state["nft_tables"] = _nft_tables()
    (work / FIREWALL_SNAPSHOT).write_text(json.dumps(state))


def _is_kubelet_rule(line: str) -> bool:
    args = shlex.split(line)
    in_kube_chain = len(args) > 1 and args[1].startswith(KUBE_CHAIN_PREFIX)
    jumps = any(flag in ("-j", "-g") and target.startswith(KUBE_CHAIN_PREFIX)
                for flag, target in zip(args, args[1:], strict=False))
    return in_kube_chain or jumps


def _iptables(command: str, table: str, *args: str) -> None:
    subprocess.run([command, "-t", table, *args], capture_output=True, check=False,
                   timeout=30)


def remove_kubelet_firewall(work: Path) -> None:
    """Remove what the kit's kubelet added to the host's firewall since ``snapshot_firewall``:
    rules in or jumping to ``KUBE-*`` chains, those chains, and the iptables tables that
    appeared with them and hold no rule now. Anything else (Docker's rules, say, added
    meanwhile) is left alone."""
    path = work / FIREWALL_SNAPSHOT
    if not path.exists():
        return
    before = json.loads(path.read_text())
    for command, family in IPTABLES_FAMILIES:
        _remove_kube_chains(command, family, before.get(command, {}), before["nft_tables"])


def _remove_kube_chains(command: str, family: str, before: dict[str, list[str]],
                        tables_before: list[str]) -> None:
    for table in IPTABLES_TABLES:
        now = _iptables_lines(table, command)
        if now is None:
            continue
        old = set(before.get(table, []))
        old_chains = {line.split()[0][1:] for line in old if line.startswith(":")}
        for line in now:
            if line.startswith("-A ") and line not in old and _is_kubelet_rule(line):
                _iptables(command, table, "-D", *shlex.split(line)[1:])
        added = [line.split()[0][1:] for line in now if line.startswith(":")]
        added = [c for c in added if c.startswith(KUBE_CHAIN_PREFIX) and c not in old_chains]
        for chain in added:  # flushed first: one may still refer to another
            _iptables(command, table, "-F", chain)
        for chain in added:
            _iptables(command, table, "-X", chain)
    for table_line in _nft_tables():  # iptables-nft's tables, made by the kubelet's rules
        _, nft_family, name = table_line.split()[:3]
        if table_line in tables_before or nft_family != family or name not in IPTABLES_TABLES:
            continue
        if not any(line.startswith("-A ") for line in _iptables_lines(name, command) or []):
            subprocess.run(["nft", "delete", "table", family, name], capture_output=True,
                           check=False, timeout=30)


def _kit_cluster_running() -> bool:
    return Path("/sys/class/net", KIT_BRIDGE).exists()


class KitCluster:
    """A cluster directory for one benchmark run: ``open()`` names or starts it, ``close()``
    stops and removes what ``open()`` started (nothing, for a named one). Both block: run
    them on a thread."""

    def __init__(self, start: bool) -> None:
        self.start = start
        self.kit: Path | None = None
        self.started: Path | None = None

    def open(self) -> Path:
        """The cluster's directory (its ``kubeconfig``, ``ctr``); ``NoCluster`` says why not."""
        named = os.environ.get("SANDLOT_BENCH_K8S_DIR")
        if named:
            if not (Path(named) / "kubeconfig").exists():
                raise NoCluster(f"SANDLOT_BENCH_K8S_DIR={named} has no kubeconfig")
            return Path(named)
        kit = find_kit()
        if not self.start or kit is None or os.geteuid() != 0:
            raise NoCluster("no cluster: start one with shared/k8s/up.sh DIR and set "
                            "SANDLOT_BENCH_K8S_DIR=DIR (a full run as root starts the kit "
                            "beside the checkout by itself)")
        if _kit_cluster_running():
            raise NoCluster(f"a kit cluster already runs (bridge {KIT_BRIDGE}): set "
                            "SANDLOT_BENCH_K8S_DIR to its directory to measure on it")
        try:
            self.started = start_kit(kit, "slk8s-bench-")
        except RuntimeError as exc:
            raise NoCluster(str(exc)[-300:]) from exc
        self.kit = kit
        return self.started

    def close(self) -> None:
        work, self.started = self.started, None
        if work is not None and self.kit is not None:
            stop_kit(self.kit, work)
