"""Reproduces the rare ~60 s ``code.context_first_cell`` outlier: a pre-started kernel that
never passes its readiness check (execd logs "warm python kernel failed to start ... killed
by SIGKILL" after ``SANDLOT_CODE_START_TIMEOUT``, 60 s, and the context starts one cold).

A bench server and ``--sandboxes`` ``code-interpreter`` sandboxes; in each, every second a
new context and ``1+1``, until one takes more than 5 s or ``--seconds`` pass; then execd's
log (the sandboxes' ``container.log``) is printed. Seen once in 168 iterations on
2026-12-03, and once in ~1,100 with three sandboxes. Since readiness opens a new shell
connection for a kernel that does not answer, such a start shows as a "kernel answered
kernel_info after ... on shell connection 2" line instead of a 60 s wait; a start that still
fails logs "kernel not ready" with the kernel's threads and sockets.

Run as root from the repository root:

    PYTHONPATH=.:src .venv/bin/python tools/repro_first_cell_stall.py --seconds 900 --sandboxes 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from bench.sdk import Sandboxes
from bench.server import SandlotServer
from code_interpreter import CodeInterpreter

STALL = 5.0  # seconds: a context + first cell slower than this ends the loop


async def _loop(server: SandlotServer, seconds: float, sandboxes_n: int) -> None:
    sandboxes = Sandboxes(server, uuid.uuid4().hex[:8])
    try:
        stalled = asyncio.Event()
        await asyncio.gather(*(_one(sandboxes, seconds, i, stalled) for i in range(sandboxes_n)))
        for log in sorted(server.data_dir.glob("sandboxes/*/container.log")):
            lines = [line for line in log.read_text(errors="replace").splitlines()
                     if "Debugger warning" not in line and not line.startswith("0.00s")]
            print(f"== {log}", *lines[-40:], sep="\n")
    finally:
        await sandboxes.delete_all()
        await sandboxes.aclose()


async def _one(sandboxes: Sandboxes, seconds: float, index: int, stalled: asyncio.Event) -> None:
    """One sandbox's loop; it ends when any loop has seen a stall."""
    sandbox, _ = await sandboxes.create("code-interpreter", ready_timeout=120)
    codes = (await CodeInterpreter.create(sandbox,
                                          ready_timeout=timedelta(seconds=60))).codes
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and not stalled.is_set():
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        ctx = await codes.create_context("python")
        t1 = time.perf_counter()
        await codes.run("1+1", context=ctx)
        t2 = time.perf_counter()
        n += 1
        print(f"[{index}] {n} context {1e3 * (t1 - t0):8.1f} ms, "
              f"first cell {1e3 * (t2 - t1):8.1f} ms", flush=True)
        if ctx.id:
            await codes.delete_context(ctx.id)
        if t2 - t0 > STALL:
            print(f"[{index}] STALL")
            stalled.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=900.0)
    parser.add_argument("--sandboxes", type=int, default=1,
                        help="loops run at once, each on a sandbox of its own (more load)")
    opts = parser.parse_args()
    server = SandlotServer(warm_pool_size=opts.sandboxes)
    server.start()
    try:
        asyncio.run(_loop(server, opts.seconds, opts.sandboxes))
    finally:
        server.stop()
        server.remove()


if __name__ == "__main__":
    main()
