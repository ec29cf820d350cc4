"""Where a raw-HTTP stdout stream's CPU goes: per process, for ``commands.stream_http``.

Starts a bench server (``bench.server.SandlotServer``), creates one ``base`` sandbox and
runs the bench's raw stream (``bench.benchmarks.commands.stream_raw``: ``POST /command`` of
``yes <73-byte text> | head -c N`` over the endpoint the SDK uses, read with httpx) ROUNDS
times, recording for each: MB/s, and the CPU seconds (user+system) of the API server (its
endpoint relay), of execd (its own), of the command (execd's reaped children: the shell,
``yes`` and ``head``) and of this client process. With ``--perf SECONDS`` a ``perf record``
of the whole machine runs during one extra stream (report: ``perf report -i FILE``).

Run as root from the repository root:

    .venv/bin/python tools/measure_stream.py --rounds 5 --mib 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchmarks.commands import stream_raw  # noqa: E402 - after the path above
from bench.procs import execd_pids, self_cpu_seconds  # noqa: E402
from bench.sdk import Sandboxes  # noqa: E402
from bench.server import SandlotServer  # noqa: E402
from bench.stats import percentile  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) of ``pid``, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ((int(fields[11]) + int(fields[12])) / TICK,
            (int(fields[13]) + int(fields[14])) / TICK)


async def _measure(server: SandlotServer, rounds: int, size: int, perf: float, pyspy: int,
                   native: bool, cpu: str | None) -> None:
    sandboxes = Sandboxes(server, uuid.uuid4().hex[:8])
    sandbox, _ = await sandboxes.create(
        **({"resource": {"cpu": cpu, "memory": "2Gi"}} if cpu else {}))
    try:
        pids: list[int] = []
        for _ in range(50):  # the daemon may still be settling into its cgroup
            pids = sorted(execd_pids(server.container_ids([sandbox.id])))
            if pids:
                break
            await asyncio.sleep(0.1)
        if len(pids) != 1:
            raise RuntimeError(f"expected one execd for {sandbox.id}, found {pids}")
        execd = pids[0]
        await stream_raw(sandbox, 4 << 20)  # warm-up
        rows: list[tuple[float, float, float, float, float]] = []
        for _ in range(rounds):
            s0, e0, c0 = _cpu(server.pid)[0], _cpu(execd), self_cpu_seconds()
            elapsed, _events = await stream_raw(sandbox, size)
            s1, e1, c1 = _cpu(server.pid)[0], _cpu(execd), self_cpu_seconds()
            rows.append((size / elapsed / 1e6, s1 - s0, e1[0] - e0[0], e1[1] - e0[1], c1 - c0))
        mib = size / (1 << 20)
        print(f"load {os.getloadavg()[0]:.2f}; {rounds} x {mib:.0f} MiB; CPU in ms per MiB")
        print("   MB/s  server  execd  command  client")
        for mbs, srv, exd, cmd, cli in rows:
            print(f"{mbs:7.1f} {srv * 1e3 / mib:7.2f} {exd * 1e3 / mib:6.2f} "
                  f"{cmd * 1e3 / mib:8.2f} {cli * 1e3 / mib:7.2f}")
        speeds = [r[0] for r in rows]
        print(f"MB/s p50 {statistics.median(speeds):.1f} p90 {percentile(sorted(speeds), 90):.1f} "
              f"min {min(speeds):.1f}")
        for i, name in enumerate(("server", "execd", "command", "client"), start=1):
            per = [r[i] * 1e3 / mib for r in rows]
            print(f"{name:>8} ms/MiB p50 {statistics.median(per):.2f}")
        if perf > 0:
            out = Path(f"/tmp/measure-stream-{os.getpid()}.perf")
            rec = subprocess.Popen(["perf", "record", "-a", "-g", "-o", str(out), "--",
                                    "sleep", str(perf)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            await asyncio.sleep(0.3)
            await stream_raw(sandbox, size)
            rec.wait()
            print(f"perf data: {out} (server {server.pid}, execd {execd}, client {os.getpid()})")
        if pyspy:
            out = Path(f"/tmp/measure-stream-{os.getpid()}-execd.txt")
            spy_bin = str(Path(sys.executable).with_name("py-spy"))
            spy = subprocess.Popen([spy_bin, "record", "-p", str(execd), "-r", "200", "-f",
                                    "raw", "-o", str(out), *(["--native"] if native else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(1.0)
            for _ in range(pyspy):
                await stream_raw(sandbox, size)
            spy.send_signal(2)
            spy.wait()
            print(f"py-spy of execd: {out}")
    finally:
        await sandboxes.delete(sandbox)
        await sandboxes.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--perf", type=float, default=0.0,
                        help="seconds of a system-wide perf record during one more stream")
    parser.add_argument("--pyspy", type=int, default=0,
                        help="streams more under py-spy record of execd (collapsed stacks)")
    parser.add_argument("--native", action="store_true", help="py-spy --native")
    parser.add_argument("--cpu", default=None,
                        help="the sandbox's cpu limit (default: the SDK's, 1 core)")
    opts = parser.parse_args()
    server = SandlotServer(warm_pool_size=1)
    server.start()
    try:
        asyncio.run(_measure(server, opts.rounds, opts.mib << 20, opts.perf, opts.pyspy,
                             opts.native, opts.cpu))
    finally:
        server.stop()
        server.remove()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
