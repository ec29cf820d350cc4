"""A kernel is the OOM killer's choice before execd from its first moment, not only once it
answers: a kernel starting while a cell hits the memory limit (the pool's replacement, the
fresh kernel after an OOM kill) would otherwise carry execd's score, and between equals the
OOM killer takes the larger process, execd (seen once in CI as a stream cut mid-OOM)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from sandlot.execd import oomscore
from sandlot.execd.code.kernels import jupyter


async def test_a_starting_kernel_is_preferred_before_it_is_ready(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[int] = []

    async def not_ready_yet(_kc: object, _timeout: float, _alive: object, **_kw: object) -> None:
        seen.append(int(Path(f"/proc/{kernel.pid}/oom_score_adj").read_text()))
        raise RuntimeError("stopped by the test before readiness")

    monkeypatch.setattr(jupyter.ready, "wait_ready", not_ready_yet)
    kernel = jupyter.JupyterKernel(KernelSpecManager(), "python3", "python",
                                   cwd=str(tmp_path), env=dict(os.environ))
    with pytest.raises(jupyter.KernelDied):
        await kernel.start(30)
    assert seen == [oomscore.child_oom_score_adj()]
    assert seen[0] > int(Path("/proc/self/oom_score_adj").read_text())
