"""The store's share of a burst: the writes of N creates at once, committed together.

A create that reaches Running writes its sandbox row, a diagnostic event and (once the
client asks for them) two endpoint rows; a burst's writes meet in the store's group commit.
This times those writes for ``--burst`` creates at once against a fresh SQLite file (the
default store), ``--rounds`` times, and prints p50/p90/max and the driver calls per
round (one per row before the rows were batched). Compare two trees by running it with
``PYTHONPATH`` pointing at each:

    PYTHONPATH=src .venv/bin/python tools/measure_store_writes.py --rounds 40
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.stats import percentile
from sqlalchemy import event

from sandlot.server.models import SandboxRecord, SandboxState, utcnow
from sandlot.server.store import SandboxStore
from sandlot.server.store.events import Event, EventStore


def _record(sandbox_id: str) -> SandboxRecord:
    now = utcnow()
    return SandboxRecord(
        id=sandbox_id, state=SandboxState.RUNNING, image_uri="base", entrypoint=["sleep"],
        execd_token=None,
        created_at=now, last_transition_at=now, updated_at=now,
        expires_at=now + timedelta(minutes=10), reason="Ready", message="running",
        metadata={"run": "bench"}, resource_limits={"cpu": "1", "memory": "512Mi"},
    )


async def _measure(db: Path, burst: int, rounds: int) -> tuple[list[float], list[int]]:
    store = await SandboxStore.open(f"sqlite+aiosqlite:///{db}")
    events = EventStore(store)
    calls = [0]

    def count(*_args: Any) -> None:
        calls[0] += 1

    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    times: list[float] = []
    per_round: list[int] = []

    async def create(sandbox_id: str, n: int) -> None:
        await asyncio.gather(
            store.save(_record(sandbox_id)),
            events.add(Event(sandbox_id, time.time(), "Normal", "Started", "running")),
            store.save_endpoint(sandbox_id, 44772, 40000 + n),
            store.save_endpoint(sandbox_id, 8080, 50000 + n))

    try:
        for r in range(rounds):
            calls[0] = 0
            started = time.perf_counter()
            await asyncio.gather(*(create(f"r{r}-{i}", i) for i in range(burst)))
            times.append((time.perf_counter() - started) * 1000)
            per_round.append(calls[0])
    finally:
        await store.close()
    return times, per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandlot-store-") as tmp:
        times, calls = asyncio.run(_measure(Path(tmp) / "db.sqlite", args.burst, args.rounds))
    times.sort()
    print(f"{args.burst} creates' writes ({4 * args.burst} rows), {args.rounds} rounds: "
          f"p50 {percentile(times, 50):.2f} p90 {percentile(times, 90):.2f} "
          f"max {times[-1]:.2f} ms; driver calls per round p50 {sorted(calls)[len(calls) // 2]}")


if __name__ == "__main__":
    main()
