"""A stopped server (SIGTERM) leaves no warm-pool container behind: no process, mount or folder."""

from __future__ import annotations

import time
from pathlib import Path

from tests.compat.conftest import SandlotServer


def _pool_dirs(server: SandlotServer) -> list[Path]:
    root = server.data_dir / "sandboxes"
    return sorted(root.glob("_pool-*")) if root.is_dir() else []


def _processes_in(container_ids: list[str]) -> list[int]:
    """Pids whose cgroup is one of these containers' (how runc places every container process)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] == "Z":  # already dead, only waiting for its reaper
            continue
        if any(f"/sandlot/{cid}" in cgroups for cid in container_ids):
            found.append(int(proc.name))
    return found


def test_sigterm_removes_the_warm_pool(fresh_server: SandlotServer) -> None:
    # A warm container's folder appears before its process starts: wait for both.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pooled = _pool_dirs(fresh_server)
        if len(pooled) >= 2 and _processes_in([p.name for p in pooled]):
            break
        time.sleep(0.2)
    pooled = _pool_dirs(fresh_server)
    assert len(pooled) >= 2, "the server did not prewarm its pool"
    assert _processes_in([p.name for p in pooled]), "warm containers should be running"
    fresh_server.stop()  # SIGTERM and wait
    assert _pool_dirs(fresh_server) == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert all(str(p) not in mounts for p in pooled)
    assert _processes_in([p.name for p in pooled]) == []
