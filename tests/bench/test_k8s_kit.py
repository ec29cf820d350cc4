"""Which cluster the ``kubernetes`` benchmark measures on (``bench/k8s_kit.py``), without
starting one: a named cluster is used as it is and left running; a quick run with none named
skips with the reason; a named directory without a kubeconfig is refused. And what stopping a
kit cluster removes from the host's firewall (the kubelet's rules, nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.k8s_kit import KitCluster, NoCluster


def test_a_named_cluster_is_used_and_left_running(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    monkeypatch.setenv("SANDLOT_BENCH_K8S_DIR", str(tmp_path))
    kit = KitCluster(start=True)
    assert kit.open() == tmp_path
    kit.close()  # nothing it started: nothing stopped or removed
    assert (tmp_path / "kubeconfig").exists()


def test_a_named_directory_without_kubeconfig_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOT_BENCH_K8S_DIR", str(tmp_path))
    with pytest.raises(NoCluster, match="no kubeconfig"):
        KitCluster(start=True).open()


def test_a_quick_run_with_no_cluster_named_skips_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOT_BENCH_K8S_DIR", raising=False)
    with pytest.raises(NoCluster, match="SANDLOT_BENCH_K8S_DIR"):
        KitCluster(start=False).open()


# Runs in a network namespace of its own (``unshare --net``): the host's firewall is never
# touched. Rules as the kit's kubelet writes them, one of another owner beside them.
_FIREWALL_SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench import k8s_kit

def ipt(*args):
    subprocess.run(["iptables", *args], check=True)

def state():
    tables = {t: k8s_kit._iptables_lines(t) for t in k8s_kit.IPTABLES_TABLES}
    tables6 = {t: k8s_kit._iptables_lines(t, "ip6tables") for t in k8s_kit.IPTABLES_TABLES}
    return {"iptables": tables, "ip6tables": tables6, "nft": k8s_kit._nft_tables()}

work = Path(sys.argv[2])
other = sys.argv[3] == "other"
if other:
    ipt("-t", "filter", "-N", "OTHER-BEFORE")
    ipt("-t", "filter", "-A", "INPUT", "-j", "OTHER-BEFORE")
k8s_kit.snapshot_firewall(work)
ipt("-t", "filter", "-N", "KUBE-FIREWALL")
ipt("-t", "filter", "-N", "KUBE-KUBELET-CANARY")
ipt("-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL")
ipt("-t", "filter", "-A", "OUTPUT", "-j", "KUBE-FIREWALL")
ipt("-t", "filter", "-A", "KUBE-FIREWALL", "-m", "comment", "--comment",
    "kubernetes firewall for dropping marked packets", "-m", "mark", "--mark",
    "0x8000/0x8000", "-j", "DROP")
ipt("-t", "nat", "-N", "KUBE-POSTROUTING")
ipt("-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment",
    "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING")
ipt("-t", "nat", "-A", "KUBE-POSTROUTING", "-j", "MASQUERADE", "--random-fully")
ipt("-t", "mangle", "-N", "KUBE-KUBELET-CANARY")
subprocess.run(["ip6tables", "-N", "KUBE-FIREWALL"], check=True)
subprocess.run(["ip6tables", "-A", "OUTPUT", "-j", "KUBE-FIREWALL"], check=True)
if other:  # added while the kit ran, by someone else: stays
    ipt("-t", "nat", "-A", "POSTROUTING", "-s", "198.51.100.0/24", "-j", "MASQUERADE")
k8s_kit.remove_kubelet_firewall(work)
print(json.dumps(state()))
"""


def _firewall_after(tmp_path: Path, other: bool) -> dict[str, object]:
    import json
    import os
    import shutil
    import subprocess
    import sys

    tools = ("iptables", "ip6tables", "nft", "unshare")
    if os.geteuid() != 0 or not all(shutil.which(t) for t in tools):
        pytest.skip("needs root, iptables, ip6tables, nft and unshare")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", _FIREWALL_SCRIPT, str(repo), str(tmp_path),
         "other" if other else "none"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    state: dict[str, object] = json.loads(proc.stdout)
    return state


def test_the_kubelets_firewall_rules_go_with_the_kit(tmp_path: Path) -> None:
    state = _firewall_after(tmp_path, other=False)
    tables = state["iptables"]
    assert isinstance(tables, dict)
    assert not [line for lines in tables.values() for line in lines or [] if "KUBE" in line]
    tables6 = state["ip6tables"]
    assert isinstance(tables6, dict)
    assert not [line for lines in tables6.values() for line in lines or [] if "KUBE" in line]
    # the iptables-nft tables the rules brought are gone too: no hook, no conntrack left
    assert state["nft"] == []


def test_rules_of_others_stay(tmp_path: Path) -> None:
    state = _firewall_after(tmp_path, other=True)
    tables = state["iptables"]
    assert isinstance(tables, dict)
    assert not [line for lines in tables.values() for line in lines or [] if "KUBE" in line]
    assert "-A INPUT -j OTHER-BEFORE" in tables["filter"]
    assert "-A POSTROUTING -s 198.51.100.0/24 -j MASQUERADE" in tables["nat"]
    assert "table ip filter" in state["nft"] and "table ip nat" in state["nft"]
    assert "table ip mangle" not in state["nft"]  # only the kubelet's canary was there
    assert "table ip6 filter" not in state["nft"]
