"""Issue 10, Docker backend: create-to-Running and ``commands.run("true")`` on a second
``sandlot serve`` with ``[runtime] type = "docker"``, beside raw ``docker run -d`` +
``docker exec true`` and ``docker exec true`` on the same engine and image.

The engine is the baselines' private dockerd (``env.docker()``: no bridge, no iptables), so
the server uses ``network_mode = "none"`` (execd reached through the container's network
namespace). The image is the one the baselines imported (the ``base`` rootfs), pooled: the
server keeps ``WARM_POOL`` warm containers of it, as a server configured for it would.
"""

from __future__ import annotations

import asyncio
import time

from opensandbox import SandboxManager

from bench.baselines.docker import IMAGE
from bench.benchmarks.state import SIZES_MIB, snapshot_ready
from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms, skipped
from bench.sdk import Sandboxes
from bench.server import SandlotServer

BENCH = "docker"
KEYS = ("docker.create", "docker.true_rtt", "docker.snapshot", "docker.create_from_snapshot")
CREATE_TIMEOUT = 120.0
WARM_POOL = 2
MAX_CREATES = 20  # bounded: each waits for the pool's refill
REFILL_PAUSE = 1.0  # seconds; a warm container starts in well under that on an idle machine
LABELS = {"docker.create": "docker backend: create-to-Running (serial)",
          "docker.true_rtt": 'docker backend: commands.run("true") round trip',
          "docker.snapshot": "docker backend: snapshot (docker commit) of a running sandbox",
          "docker.create_from_snapshot": "docker backend: create-to-Running from a snapshot"}


def _skipped(why: str) -> list[Row]:
    return [skipped(key, BENCH, label, "ms", why) for key, label in LABELS.items()]


async def _measure(env: BenchEnv, boxes: Sandboxes) -> tuple[list[float], list[float]]:
    sc = env.scale
    warm, _ = await asyncio.wait_for(boxes.create(IMAGE), CREATE_TIMEOUT)  # engine caches hot
    await boxes.delete(warm)
    creates: list[float] = []
    for _ in range(min(sc.create_serial, MAX_CREATES)):
        # The pool refills between creates (a real server's creates are not back to back).
        await asyncio.sleep(REFILL_PAUSE)
        await env.quiesce(timeout=5.0)
        sandbox, elapsed = await asyncio.wait_for(boxes.create(IMAGE), CREATE_TIMEOUT)
        creates.append(elapsed)
        await boxes.delete(sandbox)
    sandbox, _ = await asyncio.wait_for(boxes.create(IMAGE), CREATE_TIMEOUT)
    rtt: list[float] = []
    try:
        for _ in range(5):  # warm-up: connections open, code paths hot
            await sandbox.commands.run("true")
        await env.quiesce()
        for _ in range(sc.command_runs):
            t0 = time.perf_counter()
            execution = await sandbox.commands.run("true")
            rtt.append(time.perf_counter() - t0)
            if execution.error is not None:
                raise RuntimeError(f"`true` failed in the sandbox: {execution.error}")
    finally:
        await boxes.delete(sandbox)
    return creates, rtt


async def _measure_snapshots(env: BenchEnv, boxes: Sandboxes) -> list[Row]:
    """Snapshot time per size, and create from the first snapshot beside from the image."""
    runs = 2 if env.quick else 5
    manager = await SandboxManager.create(connection_config=boxes.config())
    rows: list[Row] = []
    made: list[str] = []
    try:
        for size in SIZES_MIB:
            sandbox, _ = await asyncio.wait_for(boxes.create(IMAGE), CREATE_TIMEOUT)
            ex = await sandbox.commands.run(
                f"mkdir -p /workspace/data && head -c {size}M /dev/urandom > "
                "/workspace/data/big && for i in $(seq 1 200); do echo $i > "
                "/workspace/data/f$i; done")
            if ex.error is not None:
                raise RuntimeError(f"writing {size} MiB failed: {ex.error}")
            times = []
            for _ in range(runs):
                sid, elapsed = await snapshot_ready(manager, sandbox)
                made.append(sid)
                times.append(elapsed)
            await boxes.delete(sandbox)
            rows.append(Row(
                key=f"docker.snapshot.{size}mib", bench=BENCH,
                label=f"{LABELS['docker.snapshot']}, {size} MiB changed", unit="ms",
                sandlot=Measured("sandlot[docker]", ms(times)),
                target=Target("<=", 1000, "p50", "issue 13") if size == 100 else None,
                note=f"{runs} commit(s) of one sandbox; 200 small files beside the big one"))
        from_snap, from_image = [], []
        for _ in range(runs):
            sb, elapsed = await asyncio.wait_for(boxes.create(None, snapshot_id=made[0]),
                                                 CREATE_TIMEOUT)
            from_snap.append(elapsed)
            await boxes.delete(sb)
            await asyncio.sleep(REFILL_PAUSE)
            sb, elapsed = await asyncio.wait_for(boxes.create(IMAGE), CREATE_TIMEOUT)
            from_image.append(elapsed)
            await boxes.delete(sb)
        rows.append(Row(
            key="docker.create_from_snapshot", bench=BENCH,
            label=f"{LABELS['docker.create_from_snapshot']} (10 MiB commit)", unit="ms",
            sandlot=Measured("sandlot[docker]", ms(from_snap)),
            baselines=[Measured("create from image", ms(from_image))],
            note=(f"target <= 1.2x create from image (issue 13); that baseline is served by "
                  f"the warm pool ({WARM_POOL}), a snapshot create is a cold start")))
    finally:
        await boxes.delete_all()
        for sid in made:
            try:
                await manager.delete_snapshot(sid)
            except Exception:  # noqa: BLE001 - noted; the engine keeps the image
                env.note(f"docker: could not delete snapshot {sid}")
        await manager.close()
    return rows


async def run(env: BenchEnv) -> list[Row]:
    docker = await asyncio.to_thread(env.docker)
    if docker is None:
        return _skipped("no dockerd for the docker backend (see the run's notes)")
    server = SandlotServer(
        image_cache=env.server.image_cache, warm_pool_size=WARM_POOL, runtime_type="docker",
        extra_config=f'warm_pool_images = ["{IMAGE}"]\n\n[docker]\nnetwork_mode = "none"\n',
        extra_env={"DOCKER_HOST": f"unix://{docker.sock}"},
    )
    boxes = Sandboxes(server, env.sandboxes.run_id)
    try:
        await asyncio.to_thread(server.start)
        creates, rtt = await _measure(env, boxes)
        state_rows = await _measure_snapshots(env, boxes)
    finally:
        await boxes.shut_down()

    sc = env.scale
    base_create: list[float] = []
    for _ in range(min(sc.create_serial, MAX_CREATES)):
        cid, t_run = docker.run_detached()
        t_exec, _ = docker.exec(cid, ["true"])
        base_create.append(t_run + t_exec)
        docker.remove(cid)
    cid, _ = docker.run_detached()
    try:
        base_rtt = [docker.exec(cid, ["true"])[0] for _ in range(sc.command_runs)]
    finally:
        docker.remove(cid)
    return [
        Row(key="docker.create", bench=BENCH, label=LABELS["docker.create"], unit="ms",
            sandlot=Measured("sandlot[docker]", ms(creates)),
            baselines=[Measured("docker run+exec", ms(base_create))],
            note=f"warm pool of {WARM_POOL}, refilled between creates; network_mode none"),
        Row(key="docker.true_rtt", bench=BENCH, label=LABELS["docker.true_rtt"], unit="ms",
            sandlot=Measured("sandlot[docker]", ms(rtt)),
            baselines=[Measured("docker exec", ms(base_rtt))]),
        *state_rows,
    ]
