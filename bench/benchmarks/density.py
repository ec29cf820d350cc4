"""5. Density: N idle sandboxes (N = 10, 50, 100): memory, idle CPU, create latency as N grows.

Sandboxes are created one at a time and kept; at each step, after a short settle, it records
the host's used memory (total - available) above the starting point divided by N, the server's
RSS, each execd daemon's RSS and USS, and the CPU the server and the execds use while idle.
Host memory is machine-wide, so other load on the machine shows up in it (it is the honest
"what does a sandbox cost" figure, not a precise one). Baselines: idle ``runc run -d`` and
``docker run -d`` containers of the same image, measured the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bench.env import BenchEnv
from bench.procs import (
    MB,
    cgroup_memory_bytes,
    cpu_percent_over,
    execd_pids,
    host_used_bytes,
    rss,
    tree_pids,
    uss,
)
from bench.results import Measured, Row, Target, ms

BENCH = "density"
KEYS = ("density.host_per_sandbox", "density.cgroup_memory", "density.server_rss",
        "density.execd_rss", "density.execd_uss", "density.idle_cpu", "density.create_latency",
        "density.delete_all")


def _idle_baseline(name: str, start: Callable[[], int | None], stop: Callable[[], None],
                   n: int, settle: float) -> tuple[Measured, Measured | None]:
    """n idle containers: (host memory per container, each container's cgroup memory)."""
    before = host_used_bytes()
    pids = [start() for _ in range(n)]
    time.sleep(settle)
    per = (host_used_bytes() - before) / n / MB
    charged = [c / MB for c in (cgroup_memory_bytes(p) for p in pids if p) if c is not None]
    stop()
    return Measured(name, [per]), (Measured(name, charged) if charged else None)


def _baselines(env: BenchEnv, n: int, settle: float) -> tuple[list[Measured], list[Measured]]:
    host: list[Measured] = []
    cgroup: list[Measured] = []
    runc = env.runc()
    if runc is not None and n > 0:
        def start_runc() -> int | None:
            return runc.init_pid(runc.run_detached()[0])

        h, c = _idle_baseline("runc idle", start_runc, runc.close, n, settle)
        host.append(h)
        cgroup += [c] if c else []
    docker = env.docker()
    if docker is not None and n > 0:
        def start_docker() -> int | None:
            pids = docker.container_pids(docker.run_detached()[0])
            return pids[0] if pids else None

        def stop_docker() -> None:
            for cid in list(docker.containers):
                docker.remove(cid)

        h, c = _idle_baseline("docker idle", start_docker, stop_docker, n, settle)
        host.append(h)
        cgroup += [c] if c else []
    return host, cgroup


async def run(env: BenchEnv) -> list[Row]:
    sc = env.scale
    # Stop growing (with a note) rather than be cancelled: leave time to measure and delete.
    stop_at = min(time.monotonic() + sc.bench_timeout * 1.5, env.deadline - 90.0)
    server_pid = env.server.pid
    server0 = rss(server_pid)
    rows: list[Row] = []
    live = 0
    stopped_early = ""
    base_host, base_cgroup = _baselines(env, min(sc.docker_density, sc.density_steps[0]),
                                        sc.settle_seconds)
    host0 = host_used_bytes()
    try:
        for step in sc.density_steps:
            latencies: list[float] = []
            while live < step:
                if time.monotonic() > stop_at:
                    stopped_early = f"stopped at {live} sandboxes: out of time"
                    break
                _, elapsed = await asyncio.wait_for(env.sandboxes.create(), 120.0)
                latencies.append(elapsed)
                live += 1
            if live < step:
                break
            await asyncio.sleep(sc.settle_seconds)
            containers = env.server.container_ids(list(env.sandboxes.live))
            execds = sorted(p for p in execd_pids(containers) if rss(p) > 0)
            charged = [c / MB for c in (cgroup_memory_bytes(p) for p in execds) if c is not None]
            host_per = (host_used_bytes() - host0) / step / MB
            # Over several of the server's sampling ticks (every 5 s by default), not one.
            cpu = cpu_percent_over([server_pid, *execds], max(1.0, sc.idle_window_seconds))
            server_tree = sum(rss(p) for p in tree_pids(server_pid)) / MB
            rows += [
                Row(key=f"density.host_per_sandbox.{step}", bench=BENCH,
                    label=f"host memory per idle sandbox, N={step}", unit="MB",
                    sandlot=Measured("sandlot", [host_per]), baselines=base_host,
                    note=f"host used +{host_per * step:.0f} MB (machine-wide, noisy)"),
                Row(key=f"density.cgroup_memory.{step}", bench=BENCH,
                    label=f"sandbox cgroup memory (each), N={step}", unit="MB",
                    sandlot=Measured("sandlot", charged) if charged else None,
                    baselines=base_cgroup,
                    note="" if charged else "no sandbox cgroup readable"),
                Row(key=f"density.server_rss.{step}", bench=BENCH,
                    label=f"server RSS, N={step}", unit="MB",
                    sandlot=Measured("sandlot", [rss(server_pid) / MB]),
                    note=f"+{(rss(server_pid) - server0) / MB:.0f} MB since N=0; "
                         f"process tree {server_tree:.0f} MB"),
                Row(key=f"density.execd_rss.{step}", bench=BENCH,
                    label=f"execd RSS (each), N={step}", unit="MB",
                    sandlot=Measured("sandlot", [rss(p) / MB for p in execds]) if execds
                    else None,
                    target=Target("<=", 25, "p50", "issue 3"),
                    note=f"{len(execds)} execd processes found (forked from the zygote, "
                    "RSS counts its shared pages in full: USS is the cost)" if execds else
                    "no execd process found on the host"),
                Row(key=f"density.execd_uss.{step}", bench=BENCH,
                    label=f"execd USS (each, unshared), N={step}", unit="MB",
                    sandlot=Measured("sandlot", [uss(p) / MB for p in execds]) if execds
                    else None, target=Target("<=", 8, "p50", "issue 15"),
                    note="" if execds else "no execd process found on the host"),
                Row(key=f"density.idle_cpu.{step}", bench=BENCH,
                    label=f"idle CPU, server + execds, N={step}", unit="%",
                    sandlot=Measured("sandlot", [cpu]),
                    target=Target("<=", 5, "p50", "issue 15") if step >= 100 else None,
                    note=f"percent of one core, over {max(1.0, sc.idle_window_seconds):.0f} s"),
                Row(key=f"density.create_latency.{step}", bench=BENCH,
                    label=f"create-to-Running while growing to N={step}", unit="ms",
                    sandlot=Measured("sandlot", ms(latencies)) if latencies else None),
            ]
    finally:
        t0 = time.perf_counter()
        deleted = await env.sandboxes.delete_all()
        wall = time.perf_counter() - t0
    rows.append(Row(key="density.delete_all", bench=BENCH,
                    label=f"delete each of {live} sandboxes (8 at a time)", unit="ms",
                    sandlot=Measured("sandlot", ms(deleted)) if deleted else None,
                    note=f"all deleted in {wall:.1f}s" + (f"; {stopped_early}"
                                                          if stopped_early else "")))
    return rows
