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

import os
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
KIT_BRIDGE = "sltk8s0"  # shared/k8s/up.sh's bridge: present while any kit cluster runs
UP_TIMEOUT = 600.0


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
    # rm(1): far faster than shutil.rmtree on the node's unpacked images; and it stays on
    # this file system should down.sh have left a mount behind
    subprocess.run(["rm", "-rf", "--one-file-system", str(work)], capture_output=True,
                   check=False, timeout=600)


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
