"""SandboxMonitor's periodic sample with a stand-in service and runtime: every live sandbox is
read in one ``usage_many`` call per tick (a worker-thread hop per sandbox woke the event loop
once each: most of an idle server's CPU with 60 sandboxes), an OOM kill counted since the
last sample is one event, and a sandbox that ended during the read is not kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sandlot.runtime.base import ContainerInfo, ContainerState, ResourceUsage
from sandlot.server.models import SandboxState
from sandlot.server.sandbox_monitor import SandboxMonitor


@dataclass
class Rec:
    id: str
    state: SandboxState = SandboxState.RUNNING


def usage(oom_kills: int = 0) -> ResourceUsage:
    return ResourceUsage(cpu_seconds=1.0, memory_bytes=1 << 20,
                         memory_limit_bytes=256 << 20, oom_kills=oom_kills)


@dataclass
class Runtime:
    usages: dict[str, ResourceUsage | None]
    batches: list[list[str]] = field(default_factory=list)
    during_read: Any = None  # called while a batch is read (a sandbox ends meanwhile)

    async def usage(self, sandbox_id: str) -> ResourceUsage | None:
        raise AssertionError("sampled one by one")

    async def usage_many(self, ids: Sequence[str]) -> dict[str, ResourceUsage | None]:
        self.batches.append(list(ids))
        if self.during_read is not None:
            self.during_read()
        return {i: self.usages.get(i) for i in ids}

    async def inspect(self, sandbox_id: str) -> ContainerInfo:
        return ContainerInfo(sandbox_id, ContainerState.RUNNING)


@dataclass
class Service:
    runtime: Runtime
    recs: dict[str, Rec]

    def records(self) -> list[Rec]:
        return list(self.recs.values())

    def record(self, sandbox_id: str) -> Rec | None:
        return self.recs.get(sandbox_id)


@dataclass
class Recorder:
    events: list[tuple[str, str]] = field(default_factory=list)

    def record(self, sandbox_id: str, kind: str, message: str, level: str = "") -> None:
        self.events.append((sandbox_id, kind))


def monitor(recs: list[Rec], usages: dict[str, ResourceUsage | None]
            ) -> tuple[SandboxMonitor, Runtime, Service, Recorder]:
    runtime = Runtime(usages)
    service = Service(runtime, {r.id: r for r in recs})
    recorder = Recorder()
    mon = SandboxMonitor(service, recorder, interval=5.0, retention=60.0)  # type: ignore[arg-type]
    return mon, runtime, service, recorder


async def test_every_live_sandbox_in_one_read_per_tick() -> None:
    recs = [Rec("a"), Rec("b"), Rec("c", SandboxState.PENDING), Rec("d", SandboxState.PAUSED)]
    mon, runtime, _, _ = monitor(recs, {"a": usage(), "b": None, "d": usage()})
    await mon._sample_all()
    await mon._sample_all()
    assert runtime.batches == [["a", "b", "d"], ["a", "b", "d"]]  # Pending is not sampled
    assert set(mon.samples()) == {"a", "d"}  # b unreadable: no sample


async def test_an_oom_kill_since_the_last_sample_is_one_event() -> None:
    mon, runtime, _, recorder = monitor([Rec("a")], {"a": usage(0)})
    await mon._sample_all()
    runtime.usages["a"] = usage(1)
    await mon._sample_all()
    await mon._sample_all()
    assert recorder.events == [("a", "OOMKilled")]
    await mon.stop()


async def test_a_sandbox_that_ended_during_the_read_is_not_kept() -> None:
    mon, runtime, service, _ = monitor([Rec("a"), Rec("b")], {"a": usage(), "b": usage()})

    def end_b() -> None:
        service.recs["b"].state = SandboxState.TERMINATED

    runtime.during_read = end_b
    await mon._sample_all()
    assert set(mon.samples()) == {"a"}
