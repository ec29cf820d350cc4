"""``[runtime] execd_launch``: the cold path with execd started by runc ("exec") and forked
from the zygote ("zygote"), in the same run, each on a server of its own without a warm
pool (every create starts a container).

Per launch: serial cold creates, one burst of concurrent creates, and the USS (unshared
memory) and idle CPU of execd in the sandboxes of that burst, kept idle a moment. The
baseline is the same burst of raw ``runc run`` + ``runc exec true``, taken right after each
launch's burst (once its server is gone): the VM's speed drifts between minutes by more than
the target's margin, so each ratio compares bursts seconds apart.
"""

from __future__ import annotations

import asyncio

from bench.benchmarks.create import CREATE_TIMEOUT, _runc_create, runc_burst
from bench.env import BenchEnv
from bench.procs import cpu_percent_over, execd_pids, rss, uss
from bench.results import Measured, Row, Target, ms
from bench.sdk import Sandboxes
from bench.server import SandlotServer
from bench.stats import Summary

BENCH = "execd_launch"
KEYS = ("execd_launch.serial", "execd_launch.concurrent", "execd_launch.execd_uss",
        "execd_launch.idle_cpu")
LAUNCHES = ("exec", "zygote")
SERIAL = 10
BURST = 50
MB = 1 << 20


async def _one_launch(env: BenchEnv, launch: str, serial: int,
                      burst: int) -> dict[str, list[float]]:
    server = SandlotServer(image_cache=env.server.image_cache, warm_pool_size=0,
                           extra_config=env.server.extra_config
                           + f'\nexecd_launch = "{launch}"\n')
    boxes = Sandboxes(server, env.sandboxes.run_id)
    out: dict[str, list[float]] = {"serial": [], "burst": [], "uss": [], "cpu": [],
                                   "raw": []}
    try:
        await asyncio.to_thread(server.start)
        warm, _ = await asyncio.wait_for(boxes.create(), CREATE_TIMEOUT)  # caches hot
        await boxes.delete(warm)
        for _ in range(serial):
            sandbox, elapsed = await asyncio.wait_for(boxes.create(), CREATE_TIMEOUT)
            out["serial"].append(elapsed)
            await boxes.delete(sandbox)
        await env.quiesce()
        results = await asyncio.gather(
            *(asyncio.wait_for(boxes.create(), CREATE_TIMEOUT) for _ in range(burst)),
            return_exceptions=True)
        out["burst"] = [r[1] for r in results if not isinstance(r, BaseException)]
        await asyncio.sleep(env.scale.settle_seconds)
        execds = sorted(p for p in execd_pids(list(boxes.live)) if rss(p) > 0)
        out["uss"] = [uss(p) / MB for p in execds]
        if execds:
            out["cpu"] = [cpu_percent_over(execds, max(1.0, env.scale.settle_seconds))]
    finally:
        await boxes.shut_down()
    out["raw"] = await runc_burst(env, burst)  # this burst's pair, on a quiet machine
    return out


def _p50_ms(samples: list[float]) -> str:
    return f"p50 {Summary.of(ms(samples)).p50:.1f} ms" if samples else "none"


async def run(env: BenchEnv) -> list[Row]:
    serial = min(env.scale.create_serial, SERIAL)
    burst = env.scale.create_concurrency[-1][0] if env.quick else BURST
    measured = {launch: await _one_launch(env, launch, serial, burst) for launch in LAUNCHES}
    runc_c, _ = _runc_create(env, serial)
    raw_samples = measured["zygote"]["raw"]
    raw = Measured("runc run+exec", ms(raw_samples)) if raw_samples else None
    rows: list[Row] = []
    exec_ = measured["exec"]

    def m(launch: str, key: str, scale: float = 1.0) -> Measured | None:
        xs = measured[launch][key]
        return Measured(launch, [x * scale for x in xs]) if xs else None

    rows.append(Row(
        key="execd_launch.serial", bench=BENCH, label="cold create, serial, zygote vs exec",
        unit="ms", sandlot=m("zygote", "serial", 1000),
        baselines=[b for b in (m("exec", "serial", 1000), runc_c) if b],
        target=(Target("<=", round(1.2 * runc_c.summary.stat("p50"), 1), "p50",
                       "issue 15: 1.2x runc run+exec p50") if runc_c else None),
        note=f"{serial} creates on a server with warm_pool_size = 0, per launch"))
    rows.append(Row(
        key=f"execd_launch.concurrent.{burst}", bench=BENCH,
        label=f"cold create, {burst} concurrent, zygote vs exec", unit="ms",
        sandlot=m("zygote", "burst", 1000),
        baselines=[b for b in (m("exec", "burst", 1000), raw) if b],
        target=(Target("<=", round(raw.summary.stat("p50"), 1), "p50",
                       "issue 15: same-burst runc run+exec p50") if raw else None),
        note=f"zygote {len(measured['zygote']['burst'])}/{burst}, exec "
             f"{len(exec_['burst'])}/{burst} reached Running; runc run+exec is the raw "
             f"burst right after the zygote's (after exec's: {_p50_ms(exec_['raw'])})"))
    rows.append(Row(
        key="execd_launch.execd_uss", bench=BENCH,
        label=f"execd USS (each, unshared), {burst} idle sandboxes", unit="MB",
        sandlot=m("zygote", "uss"), baselines=[b for b in (m("exec", "uss"),) if b],
        target=Target("<=", 8, "p50", "issue 15")))
    rows.append(Row(
        key="execd_launch.idle_cpu", bench=BENCH,
        label=f"idle CPU of {burst} execds", unit="%",
        sandlot=m("zygote", "cpu"), baselines=[b for b in (m("exec", "cpu"),) if b],
        note="percent of one core"))
    return rows
