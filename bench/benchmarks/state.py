"""Snapshots (issue 13): time to a Ready snapshot for 10 MiB / 100 MiB of changes, and
create-from-snapshot beside create-from-image.

The snapshot time runs from ``POST /sandboxes/{id}/snapshots`` until ``GET`` reports
``Ready`` (polled every 5 ms): freeze, copy of the upper dir, thaw, record. Create from a
snapshot cannot use the warm pool (the pool keeps images), so the image baseline is noted
with the server's warm pool size.
"""

from __future__ import annotations

import asyncio
import time

from opensandbox import Sandbox, SandboxManager

from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms

BENCH = "state"
KEYS = ("state.snapshot", "state.create_from_snapshot")
SIZES_MIB = (10, 100)
POLL = 0.005


async def snapshot_ready(manager: SandboxManager, sandbox: Sandbox) -> tuple[str, float]:
    t0 = time.perf_counter()
    snap = await sandbox.create_snapshot()
    while (await manager.get_snapshot(snap.id)).status.state == "Creating":
        await asyncio.sleep(POLL)
    elapsed = time.perf_counter() - t0
    state = (await manager.get_snapshot(snap.id)).status.state
    if state != "Ready":
        raise RuntimeError(f"snapshot {snap.id} ended {state}")
    return snap.id, elapsed


async def run(env: BenchEnv) -> list[Row]:
    runs = 2 if env.quick else 5
    boxes = env.sandboxes
    manager = await SandboxManager.create(connection_config=boxes.config())
    rows: list[Row] = []
    snapshots: list[str] = []
    try:
        first: str | None = None
        for size in SIZES_MIB:
            sandbox, _ = await boxes.create()
            ex = await sandbox.commands.run(
                f"mkdir -p /workspace/data && head -c {size}M /dev/urandom > /workspace/data/big"
                " && for i in $(seq 1 200); do echo $i > /workspace/data/f$i; done"
            )
            if ex.error is not None:
                raise RuntimeError(f"writing {size} MiB failed: {ex.error}")
            times = []
            for _ in range(runs):
                sid, elapsed = await snapshot_ready(manager, sandbox)
                snapshots.append(sid)
                times.append(elapsed)
            first = first or snapshots[-1]
            rows.append(Row(
                key=f"state.snapshot.{size}mib", bench=BENCH,
                label=f"snapshot of a running sandbox, {size} MiB changed", unit="ms",
                sandlot=Measured("sandlot", ms(times)),
                target=Target("<=", 1000, "p50", "issue 13") if size == 100 else None,
                note=f"{runs} snapshot(s) of one sandbox; 200 small files beside the big one",
            ))
        assert first is not None
        from_snap, from_image = [], []
        for _ in range(runs):
            sb, elapsed = await boxes.create(None, snapshot_id=first)
            from_snap.append(elapsed)
            await boxes.delete(sb)
            sb, elapsed = await boxes.create()
            from_image.append(elapsed)
            await boxes.delete(sb)
        rows.append(Row(
            key="state.create_from_snapshot", bench=BENCH,
            label="create-to-Running from a snapshot (10 MiB layer)", unit="ms",
            sandlot=Measured("sandlot", ms(from_snap)),
            baselines=[Measured("create from image", ms(from_image))],
            note=(f"target <= 1.2x create from image; that baseline may be served by the "
                  f"warm pool ({env.server.warm_pool_size}), a snapshot create never is"),
        ))
    finally:
        await boxes.delete_all()
        for sid in snapshots:
            try:
                await manager.delete_snapshot(sid)
            except Exception:  # noqa: BLE001 - the server's data dir goes at the end anyway
                env.note(f"state: could not delete snapshot {sid}")
        await manager.close()
    return rows
