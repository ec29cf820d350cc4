"""Whole-machine CPU per create through the released SDK, split by process tree.

Starts a bench server (``bench/server.py``), creates ``--level`` sandboxes at once,
``--rounds`` times, and reports per create: the machine's busy CPU (``/proc/stat``), the
server's own and its reaped children's (``runc``, helpers), the execd zygote's tree (its
reaped first children, the live execds), this client's, and the rest (the containers' own
processes, which leave the server's tree, and kernel threads). Whether a burst is slow
because it is contended or because it is simply that much work shows here.

    .venv/bin/python tools/measure_burst_cpu.py --pool 10 --level 100
    .venv/bin/python tools/measure_burst_cpu.py --pool 0 --level 1 --rounds 40

``--threads`` also splits the server's own CPU by thread: its main thread (the event loop,
which every request and every create's steps on the server share: on a host with more
cores its time per create bounds how many creates a second the server can make, however
many cores the containers get) with its user and kernel shares, and its other threads
together (CPython gives its threads no names the kernel shows, so they are not told apart).

``--deletes`` then also deletes every sandbox the run made (8 at a time, as the bench's
``delete_all``) and reports the same split per delete, the background removals included
(a few seconds' wait): what a delete costs with that many sandboxes on the host. Processes
that end take their counted CPU with them: a container's init shows as a negative share
and an execd's whole life moves into the zygote's reaped total, so per delete read the
machine, server and runc columns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402 - after the path above
from bench.sdk import Sandboxes  # noqa: E402
from bench.server import SandlotServer  # noqa: E402

from bench import procs  # noqa: E402
from sandlot.runtime.oci.zygote import WAITER_PATH  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _machine_ms() -> float:
    """Busy CPU of the whole machine so far (``/proc/stat``), in ms."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) * 1e3 / HZ


def _own_and_reaped_ms(pid: int) -> tuple[float, float]:
    t = psutil.Process(pid).cpu_times()
    return _live_ms([pid]), (t.children_user + t.children_system) * 1e3


def _live_ms(pids: list[int]) -> float:
    """CPU of live processes at the scheduler's resolution. Not ``procs.cpu_seconds``: it
    counts whole clock ticks (10 ms) per process, so each of a hundred execds or container
    inits lost up to a tick (a 13 ms execd read as 10, a 7 ms init as 0) and the loss showed
    up as "rest"."""
    return sum(procs.process_cpu_seconds(pid) or 0.0 for pid in pids) * 1e3


def _thread_times(pid: int) -> dict[int, tuple[float, int, int]]:
    """Per live thread of ``pid``: (CPU ms from ``schedstat`` (nanoseconds), user ticks,
    system ticks). Ticks are fine here: they are summed over a whole run of one
    thread. Threads that ended meanwhile are missing, with their CPU."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            base = Path(f"/proc/{pid}/task/{tid}")
            stat = (base / "stat").read_text()
            ns = int((base / "schedstat").read_text().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(tid)] = (ns / 1e6, int(fields[11]), int(fields[12]))
    return found


def _thread_split(pid: int, n: int, before: dict[int, tuple[float, int, int]]) -> str:
    after = _thread_times(pid)
    tick_ms = 1e3 / HZ
    main_after, main_before = after[pid], before[pid]
    user = (main_after[1] - main_before[1]) * tick_ms / n
    system = (main_after[2] - main_before[2]) * tick_ms / n
    lines = [f"server main thread per create: {(main_after[0] - main_before[0]) / n:.1f} ms "
             f"(user {user:.1f}, kernel {system:.1f}; ticks)"]
    others = sum(ms - (before[tid][0] if tid in before else 0.0)
                 for tid, (ms, _, _) in after.items() if tid != pid)
    lines.append(f"  its other threads (database, tools, namespace maker) together: "
                 f"{others / n:.1f} ms per create")
    return "\n".join(lines)


def _tree_ms(root: int) -> float:
    """Own CPU of ``root`` and its live descendants, plus ``root``'s reaped children (summed
    by the kernel before the one conversion to ticks, so not truncated per child)."""
    return _live_ms(procs.tree_pids(root)) + _own_and_reaped_ms(root)[1]


def _zygote(server_pid: int) -> int:
    for pid in procs.tree_pids(server_pid):
        try:
            if "sandlot.execd.zygote" in psutil.Process(pid).cmdline():
                return pid
        except psutil.Error:
            pass
    raise SystemExit("no execd zygote under the server (execd_launch = \"exec\"?)")


def _container_inits_ms() -> float:
    """CPU of the live sandboxes' PID 1s: ``runc init`` (its Go start, namespace and mount
    set-up) ran as that same process before it became the image's init."""
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[:1] == [WAITER_PATH]:
            pids.append(proc.pid)
    return _live_ms(pids)


def _snapshot(server: int, zygote: int) -> tuple[tuple[float, float], float, float, float,
                                                  float]:
    return (_own_and_reaped_ms(server), _tree_ms(zygote), procs.self_cpu_seconds() * 1e3,
            _machine_ms(), _container_inits_ms())


def _split(label: str, n: int, server: int, zygote: int,
           before: tuple[tuple[float, float], float, float, float, float]) -> str:
    after = _snapshot(server, zygote)
    own = (after[0][0] - before[0][0]) / n
    reaped = (after[0][1] - before[0][1]) / n
    zyg = (after[1] - before[1]) / n
    client = (after[2] - before[2]) / n
    machine = (after[3] - before[3]) / n
    inits = (after[4] - before[4]) / n
    return (f"CPU per {label} (ms): machine {machine:.1f} = server {own:.1f} + its reaped "
            f"children {reaped:.1f} + zygote tree {zyg:.1f} + client {client:.1f} + container "
            f"inits {inits:.1f} + rest {machine - own - reaped - zyg - client - inits:.1f}")


async def measure(pool: int, level: int, rounds: int, deletes: bool, threads: bool) -> None:
    server = SandlotServer(warm_pool_size=pool)
    await asyncio.to_thread(server.start)
    assert server.proc is not None
    boxes = Sandboxes(server, "burst-cpu")
    try:
        first, _ = await boxes.create()  # caches hot, the zygote started
        await boxes.delete(first)
        await asyncio.sleep(4)  # the pool refilled
        zygote = _zygote(server.proc.pid)
        before = _snapshot(server.proc.pid, zygote)
        threads_before = _thread_times(server.proc.pid) if threads else {}
        t0 = time.perf_counter()
        latencies: list[float] = []
        for _ in range(rounds):
            made = await asyncio.gather(*(boxes.create() for _ in range(level)))
            latencies += [seconds * 1e3 for _, seconds in made]
        wall = (time.perf_counter() - t0) * 1e3
        n = level * rounds
        creates = _split("create", n, server.proc.pid, zygote, before)
        if threads:  # threads that ended during the run (tool threads) took their CPU along
            creates += "\n" + _thread_split(server.proc.pid, n, threads_before)
        if deletes:
            alive = len(boxes.live)
            before = _snapshot(server.proc.pid, zygote)
            t0 = time.perf_counter()
            took = sorted(x * 1e3 for x in await boxes.delete_all())
            delete_wall = (time.perf_counter() - t0) * 1e3
            await asyncio.sleep(4)  # background removals of the deleted trees
            removed = _split("delete", alive, server.proc.pid, zygote, before)
    finally:
        await boxes.shut_down()
    latencies.sort()
    print(f"pool {pool}, {rounds} x {level} at once: latency p50 {statistics.median(latencies):.0f}"
          f" ms, p99 {latencies[round(0.99 * (n - 1))]:.0f} ms, wall {wall:.0f} ms")
    print(creates)
    if deletes:
        print(f"{alive} deletes, 8 at a time: p50 {statistics.median(took):.0f} ms, p99 "
              f"{took[round(0.99 * (len(took) - 1))]:.0f} ms, wall {delete_wall:.0f} ms")
        print(removed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=10, help="the server's warm_pool_size")
    ap.add_argument("--level", type=int, default=100, help="creates at once")
    ap.add_argument("--rounds", type=int, default=1, help="bursts, one after the other")
    ap.add_argument("--deletes", action="store_true", help="then delete them all (see above)")
    ap.add_argument("--threads", action="store_true", help="split the server's CPU by thread")
    a = ap.parse_args()
    asyncio.run(measure(a.pool, a.level, a.rounds, a.deletes, a.threads))


if __name__ == "__main__":
    main()
