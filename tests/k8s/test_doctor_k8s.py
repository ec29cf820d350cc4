"""``sandlot doctor`` with ``[runtime] type = "kubernetes"``: cluster access and the
runtime's permissions, and a clear failure when the cluster cannot be reached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s_cluster import Cluster

pytestmark = pytest.mark.timeout(300)


def doctor(tmp_path: Path, section: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "sandlot.toml"
    config.write_text('[runtime]\ntype = "kubernetes"\n' + section)
    return subprocess.run(
        [sys.executable, "-m", "sandlot", "doctor", "--config", str(config), "--data-dir",
         str(tmp_path / "data")], capture_output=True, text=True, timeout=240,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLUMNS": "200"})


def test_doctor_checks_cluster_access_and_permissions(k8s_cluster: Cluster,
                                                      tmp_path: Path) -> None:
    res = doctor(tmp_path, k8s_cluster.config_toml())
    out = res.stdout
    assert "Kubernetes API" in out and "Kubernetes v1." in out, out
    assert f"permissions in namespace {k8s_cluster.namespace}" in out
    assert "all the runtime needs" in out


def test_doctor_fails_without_a_cluster(tmp_path: Path) -> None:
    res = doctor(tmp_path, f'[kubernetes]\nkubeconfig_path = "{tmp_path}/missing"\n')
    assert res.returncode != 0
    assert "Kubernetes API" in res.stdout and "FAIL" in res.stdout


def flat(out: str) -> str:
    """The doctor's table as one line of words (cells wrap across rows)."""
    return " ".join(out.replace("│", " ").split())


def test_doctor_states_the_egress_guarantees(k8s_cluster: Cluster, tmp_path: Path) -> None:
    out = flat(doctor(tmp_path, k8s_cluster.config_toml()).stdout)
    assert "egress policies" in out and "networkPolicy is refused (no [kubernetes] " \
        "dns_filter_address)" in out, out
    out = flat(doctor(tmp_path, k8s_cluster.config_toml(
        dns_filter_address="198.19.0.1", network_policy_enforced="true")).stdout)
    assert "restricted by a NetworkPolicy per sandbox" in out, out
    assert "all the runtime needs" in out  # NetworkPolicy rights checked too
    out = flat(doctor(tmp_path, k8s_cluster.config_toml(dns_filter_address="198.19.0.1")).stdout)
    assert "policies that deny by address are refused" in out, out


def test_doctor_warns_of_a_dns_filter_address_not_on_this_host(k8s_cluster: Cluster,
                                                              tmp_path: Path) -> None:
    """An address the host does not have (yet) is a warning, not a failure: the server
    listens on it anyway (a node's Pod bridge gets its address with its first Pod)."""
    absent = flat(doctor(tmp_path, k8s_cluster.config_toml(
        dns_filter_address="198.51.100.77")).stdout)
    assert "DNS filter address warn 198.51.100.77 is on no interface of this host" in absent, \
        absent
    assert "DNS filter address * FAIL" not in absent
    here = flat(doctor(tmp_path, k8s_cluster.config_toml(
        dns_filter_address="198.19.0.1", dns_filter_listen="127.0.0.1:5353")).stdout)
    assert "DNS filter address * ok listens on 127.0.0.1:5353" in here, here
