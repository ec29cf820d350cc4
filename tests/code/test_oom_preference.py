"""OOM preference: kernels (and what they start) are picked by the OOM killer before execd,
and execd's protective ``oomScoreAdj`` is only asked of runc where the host allows it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandlot.execd import oomscore
from sandlot.runtime.oci import spec as ocispec
from tests.runtime.test_spec import _config


def _adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_kernel_adj_is_execd_plus_preference(monkeypatch: pytest.MonkeyPatch) -> None:
    for own, want in ((-999, 0), (0, 999), (-500, 499), (500, 1000)):
        monkeypatch.setattr(oomscore, "_read_adj", lambda _pid, own=own: own)
        assert oomscore.child_oom_score_adj() == want


def test_prefer_for_oom_covers_descendants() -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 10
        while len(oomscore._children().get(proc.pid, [])) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = oomscore._children().get(proc.pid, [])
        assert len(kids) == 2
        oomscore.prefer_for_oom(proc.pid, adj=700)
        assert [_adj(p) for p in (proc.pid, *kids)] == [700, 700, 700]
        oomscore.prefer_for_oom(proc.pid, adj=300)  # never lowered (that would need privilege)
        assert _adj(proc.pid) == 700
    finally:
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("capable", [True, False])
def test_execd_oom_score_adj_only_when_runc_can_set_it(
    monkeypatch: pytest.MonkeyPatch, capable: bool
) -> None:
    monkeypatch.setattr(ocispec, "can_lower_oom_score_adj", lambda: capable)
    process = _config()["process"]
    if capable:
        assert process["oomScoreAdj"] == ocispec.EXECD_OOM_SCORE_ADJ == -999
    else:
        assert "oomScoreAdj" not in process
