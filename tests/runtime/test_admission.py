"""The start gate (runtime/admission.py): a burst queues; requests go before refills."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandlot.config import Config
from sandlot.runtime import admission
from sandlot.runtime.admission import ZYGOTE_SLOTS_PER_CPU, StartGate, default_slots


async def _hold(gate: StartGate, order: list[str], name: str, release: asyncio.Event,
                background: bool = False) -> None:
    async with gate.slot(background=background):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_at_most_slots_run_and_the_rest_queue_in_order() -> None:
    gate = StartGate(2)
    order: list[str] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, order, f"r{i}", release)) for i in range(5)]
    await _settle()
    assert order == ["r0", "r1"] and gate.running == 2 and gate.waiting == 3
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["r0", "r1", "r2", "r3", "r4"]
    assert gate.running == 0 and gate.waiting == 0


async def test_waiting_requests_go_before_waiting_background_starts() -> None:
    gate = StartGate(1)
    order: list[str] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(gate, order, "first", first))
    await _settle()
    refill = asyncio.create_task(_hold(gate, order, "refill", rest, background=True))
    await _settle()
    request = asyncio.create_task(_hold(gate, order, "request", rest))
    await _settle()
    rest.set()
    first.set()
    await asyncio.gather(holder, refill, request)
    assert order == ["first", "request", "refill"]


async def test_background_start_waits_while_a_request_is_queued() -> None:
    gate = StartGate(1)
    order: list[str] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(gate, order, "first", first))
    request = asyncio.create_task(_hold(gate, order, "request", rest))
    await _settle()
    refill = asyncio.create_task(_hold(gate, order, "refill", rest, background=True))
    await _settle()
    assert order == ["first"]
    first.set()
    rest.set()
    await asyncio.gather(holder, request, refill)
    assert order == ["first", "request", "refill"]


async def test_background_start_waits_while_a_request_starts() -> None:
    """A free slot is not enough: a refill waits until no create's start runs."""
    gate = StartGate(4)
    order: list[str] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(gate, order, "request", first))
    await _settle()
    refill = asyncio.create_task(_hold(gate, order, "refill", rest, background=True))
    await _settle()
    assert order == ["request"] and gate.running == 1 and gate.waiting == 1
    first.set()
    await _settle()
    assert order == ["request", "refill"] and gate.running == 1
    rest.set()
    await asyncio.gather(holder, refill)
    assert gate.running == 0 and gate.running_requests == 0 and gate.waiting == 0


async def test_a_refill_that_waited_long_starts_beside_creates_but_not_before_queued_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "BACKGROUND_PATIENCE", 0.05)
    gate = StartGate(2)
    order: list[str] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(gate, order, "request", first))
    await _settle()
    refill = asyncio.create_task(_hold(gate, order, "refill", rest, background=True))
    await asyncio.sleep(0.2)
    assert order == ["request", "refill"]  # patience lost: a free slot beside the create
    queued = asyncio.create_task(_hold(gate, order, "queued", rest))
    late = asyncio.create_task(_hold(gate, order, "late", rest, background=True))
    await asyncio.sleep(0.2)
    assert order == ["request", "refill"] and gate.waiting == 2  # no slot free
    first.set()
    await _settle()
    assert order == ["request", "refill", "queued"]  # the queued create first
    rest.set()
    await asyncio.gather(holder, refill, queued, late)
    assert order[-1] == "late" and gate.running == 0 and gate.waiting == 0


async def test_a_cancelled_waiter_gives_up_its_place_and_leaks_no_slot() -> None:
    gate = StartGate(1)
    order: list[str] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(gate, order, "first", first))
    await _settle()
    gone = asyncio.create_task(_hold(gate, order, "gone", rest))
    after = asyncio.create_task(_hold(gate, order, "after", rest))
    await _settle()
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    first.set()
    rest.set()
    await asyncio.gather(holder, after)
    assert order == ["first", "after"] and gate.running == 0 and gate.waiting == 0


async def test_an_exception_in_the_body_frees_the_slot() -> None:
    gate = StartGate(1)
    with pytest.raises(RuntimeError):
        async with gate.slot():
            raise RuntimeError("start failed")
    assert gate.running == 0
    async with gate.slot():
        assert gate.running == 1


def test_zero_means_two_slots_per_cpu() -> None:
    assert StartGate(0).slots == default_slots() >= 1


def test_zero_means_four_per_cpu_for_zygote_starts_and_a_setting_wins() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert StartGate(0, per_cpu=ZYGOTE_SLOTS_PER_CPU).slots == 4 * cpus == 2 * default_slots()
    assert StartGate(3, per_cpu=ZYGOTE_SLOTS_PER_CPU).slots == 3
    assert StartGate(3).slots == 3


def test_the_config_key_is_honoured_and_bounded(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("[runtime]\nmax_concurrent_starts = 3\n")
    cfg = Config.load(cfg_file)
    assert cfg.runtime.max_concurrent_starts == 3
    assert not any("max_concurrent_starts" in w for w in cfg.warnings())
    assert Config().runtime.max_concurrent_starts == 0  # two per CPU
    with pytest.raises(ValidationError, match="max_concurrent_starts"):
        Config.model_validate({"runtime": {"max_concurrent_starts": -1}})
