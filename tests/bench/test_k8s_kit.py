"""Which cluster the ``kubernetes`` benchmark measures on (``bench/k8s_kit.py``), without
starting one: a named cluster is used as it is and left running; a quick run with none named
skips with the reason; a named directory without a kubeconfig is refused."""

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
