"""An idle execd sets no timer: the command janitor sleeps only while it has work.

(100 idle sandboxes must cost <= 5 % of a core: issue 15; measured in bench density and
tools/measure_idle.py, not here.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandlot.execd import commands
from sandlot.execd.commands import CommandService
from sandlot.execd.settings import Settings


async def test_the_janitor_waits_for_work_and_still_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_sleep = asyncio.sleep
    naps: list[float] = []

    async def recorded(seconds: float) -> None:
        naps.append(seconds)
        await real_sleep(0.01)  # the janitor's nap, shortened

    monkeypatch.setattr(commands.asyncio, "sleep", recorded)
    service = CommandService(Settings(state_dir=str(tmp_path), retention_seconds=0.0))
    await service.startup()
    try:
        for _ in range(5):
            await real_sleep(0.02)
        assert naps == []  # idle: no periodic wake-up
        ex = service.new_execution("true", background=True)
        ex.finish(0)
        for _ in range(100):
            if not service.executions:
                break
            await real_sleep(0.02)
        assert ex.id not in service.executions  # expired after its retention
        assert naps  # the janitor ran for it
        count = len(naps)
        for _ in range(5):
            await real_sleep(0.02)
        assert len(naps) == count  # and went back to waiting
    finally:
        await service.shutdown()
