"""Where a warm ``1+1``'s time and CPU go, for ``code.warm``: per hop and per process.

Each round runs ``--runs`` warm ``1+1``s three ways, alternated round by round:

- ``direct``: ``jupyter_client`` against a kernel on the host (the bench's baseline);
- ``raw``: ``POST /code`` read with httpx as bytes (execd, and the relay in a sandbox);
- ``sdk``: the released ``opensandbox-code-interpreter`` SDK's ``codes.run``.

For each: wall p50/p90 and CPU ms per run of the API server (its endpoint relay), execd, the
kernel (execd's children) and this client process. ``--standalone`` runs execd on the host
(no sandbox, no relay: what the SDK costs beside execd); otherwise a bench server and one
``code-interpreter`` sandbox. ``--cold N`` also times N back-to-back new contexts + first
cell against N cold host kernel starts.

Run as root from the repository root:

    PYTHONPATH=. .venv/bin/python tools/measure_code.py --rounds 3 --runs 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench.baselines.jupyter import JupyterBaseline
from bench.procs import execd_pids, self_cpu_seconds
from bench.sdk import Sandboxes
from bench.server import SandlotServer
from bench.stats import percentile
from code_interpreter import CodeInterpreter
from code_interpreter.adapters.code_adapter import CodesAdapter
from opensandbox.config import ConnectionConfig
from opensandbox.models.sandboxes import SandboxEndpoint

TICK = os.sysconf("SC_CLK_TCK")
BODY_CODE = "1+1"


def _cpu(pid: int | None) -> float:
    """utime+stime of ``pid`` in seconds (0 when unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Target:
    """Where runs go: an endpoint with its headers, and the processes whose CPU counts."""
    endpoint: str
    headers: dict[str, str]
    server_pid: int | None
    execd_pid: int

    def kernel_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.execd_pid).children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> tuple[float, float, float, float]:
        return (_cpu(self.server_pid), _cpu(self.execd_pid),
                sum(_cpu(p) for p in self.kernel_pids()), self_cpu_seconds())


Runner = Callable[[], Awaitable[None]]


async def _timed(target: Target, runs: int, one: Runner, kernel: int | None = None,
                 between: Runner | None = None) -> tuple[list[float], list[float]]:
    """(wall seconds per run, CPU ms per run of server, execd, kernel, client); with
    ``kernel``, that pid's CPU is the kernel column (the host kernel of ``direct``); with
    ``between``, that runs untimed after each run (its client CPU counts in the column)."""
    def sample() -> tuple[float, ...]:
        server, execd, kern, client = target.sample()
        return (0.0, 0.0, _cpu(kernel), client) if kernel else (server, execd, kern, client)

    for _ in range(3):
        await one()
    before = sample()
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await one()
        walls.append(time.perf_counter() - t0)
        if between is not None:
            await between()
    after = sample()
    return walls, [(a - b) * 1e3 / runs for a, b in zip(after, before, strict=True)]


def _report(name: str, walls: list[float], cpu: list[float], base: float | None) -> None:
    p50 = statistics.median(walls) * 1e3
    ratio = f" ({p50 / base:.2f}x)" if base else ""
    print(f"  {name:7} p50 {p50:6.2f}{ratio:9} p90 {percentile(sorted(walls), 90) * 1e3:6.2f} "
          f"p99 {percentile(sorted(walls), 99) * 1e3:6.2f} ms | CPU ms/run server {cpu[0]:.2f} "
          f"execd {cpu[1]:.2f} kernel {cpu[2]:.2f} client {cpu[3]:.2f}", flush=True)


async def _rounds(targets: dict[str, Target], rounds: int, runs: int, cold: int,
                  interleave: bool = False) -> None:
    """``rounds`` rounds of: direct, then raw and SDK runs against each target (the order
    of targets and of raw/SDK reversed every other round). ``interleave``: each sandbox
    run is followed by an untimed direct run, as ``bench code`` alternates them request by
    request (its processes then wait idle between runs, their caches taken by the other)."""
    config = ConnectionConfig(request_timeout=timedelta(seconds=60))
    jb = JupyterBaseline()
    jb.start()
    clients: list[httpx.AsyncClient] = []
    runners: dict[str, tuple[Target, Runner, Runner, Any, Any]] = {}
    try:
        for label, target in targets.items():
            codes = CodesAdapter(SandboxEndpoint(endpoint=target.endpoint,
                                                 headers=target.headers), config)
            ctx = await codes.create_context("python")
            assert ctx.id is not None
            client = httpx.AsyncClient(headers=target.headers, timeout=60.0)
            clients.append(client)
            runners[label] = (target, *_runners(client, codes, ctx, target), codes, ctx)

        async def direct() -> None:
            jb.execute(BODY_CODE)

        for i in range(rounds):
            print(f"round {i + 1}, load {os.getloadavg()[0]:.2f}", flush=True)
            any_target = next(iter(targets.values()))
            d_walls, d_cpu = await _timed(any_target, runs, direct, jb.pid())
            base = statistics.median(d_walls) * 1e3
            _report("direct", d_walls, d_cpu, None)
            labels = list(runners) if i % 2 == 0 else list(runners)[::-1]
            for label in labels:
                target, raw, sdk, _codes, _ctx = runners[label]
                order = [("raw", raw), ("sdk", sdk)]
                for name, one in order if i % 2 == 0 else order[::-1]:
                    walls, cpu = await _timed(target, runs, one,
                                              between=direct if interleave else None)
                    _report(f"{label} {name}", walls, cpu, base)
        if cold:
            for label, (_t, _r, _s, codes, _c) in runners.items():
                await _cold(label, codes, cold)
    finally:
        jb.close()
        for client in clients:
            await client.aclose()
        for _t, _r, _s, codes, ctx in runners.values():
            await codes.delete_context(ctx.id)


def _runners(client: httpx.AsyncClient, codes: Any, ctx: Any,
             target: Target) -> tuple[Runner, Runner]:
    url = f"http://{target.endpoint}/code"
    body = {"code": BODY_CODE, "context": {"id": ctx.id, "language": "python"}}

    async def raw() -> None:
        r = await client.post(url, json=body)
        if b'"execution_complete"' not in r.content:
            raise RuntimeError(r.content[-200:])

    async def sdk() -> None:
        ex = await codes.run(BODY_CODE, context=ctx)
        if ex.error is not None:
            raise RuntimeError(ex.error)

    return raw, sdk


async def _cold(label: str, codes: Any, n: int) -> None:
    """n x (a cold host kernel start, then a new context + first cell right after another
    new context: the pool's replacement is still starting, as in ``code.context_cold``)."""
    starts, made = [], []
    for _ in range(n):
        extra = JupyterBaseline()
        try:
            starts.append(extra.start())
        finally:
            extra.close()
        await asyncio.sleep(3)  # the pool refills
        first = await codes.create_context("python")
        await codes.run(BODY_CODE, context=first)
        t0 = time.perf_counter()
        new = await codes.create_context("python")
        await codes.run(BODY_CODE, context=new)
        made.append(time.perf_counter() - t0)
        for c in (first, new):
            await codes.delete_context(c.id)
    s50, m50 = statistics.median(starts), statistics.median(made)
    s90, m90 = percentile(sorted(starts), 90), percentile(sorted(made), 90)
    print(f"{label} cold: host kernel start p50 {s50 * 1e3:.0f} p90 {s90 * 1e3:.0f} ms; "
          f"back-to-back context + 1+1 p50 {m50 * 1e3:.0f} p90 {m90 * 1e3:.0f} ms "
          f"({m50 / s50:.2f}x)", flush=True)


def _start_execd(tmp: Path, src: str | None) -> tuple[psutil.Popen, Target]:
    """A standalone execd with the code service (python pre-started), from ``src`` (a
    ``src`` directory) or from this environment's sandlot."""
    tmp.mkdir(parents=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    token = uuid.uuid4().hex
    env = {**os.environ, "SANDLOT_EXECD_TOKEN": token, "SANDLOT_CODE_PRESTART": "python",
           "SANDLOT_CODE_READY_PORT": "0"}
    if src:
        env["PYTHONPATH"] = src
    (tmp / "work").mkdir()
    with open(tmp / "execd.log", "wb") as log:
        proc = psutil.Popen([sys.executable, "-m", "sandlot.execd", "--listen",
                             f"tcp:127.0.0.1:{port}", "--workdir", str(tmp / "work"),
                             "--state-dir", str(tmp / "state")], env=env, stdout=log,
                            stderr=log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / "execd.log").read_text())
        time.sleep(0.05)
    return proc, Target(f"127.0.0.1:{port}", {"X-EXECD-ACCESS-TOKEN": token}, None, proc.pid)


def _standalone(rounds: int, runs: int, cold: int, old_src: str | None,
                interleave: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="measure-code-"))
    procs: list[psutil.Popen] = []
    targets: dict[str, Target] = {}
    try:
        for label, src in [("new", None), *([("old", old_src)] if old_src else [])]:
            proc, targets[label] = _start_execd(tmp / label, src)
            procs.append(proc)
        asyncio.run(_rounds(targets, rounds, runs, cold, interleave))
    finally:
        for proc in procs:
            for child in proc.children(recursive=True):
                child.kill()
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


async def _in_sandbox(server: SandlotServer, rounds: int, runs: int, cold: int,
                      interleave: bool) -> None:
    sandboxes = Sandboxes(server, uuid.uuid4().hex[:8])
    sandbox, _ = await sandboxes.create("code-interpreter", ready_timeout=120.0)
    try:
        ci: Any = await CodeInterpreter.create(sandbox, skip_health_check=True)
        await ci.aclose()
        pids = sorted(execd_pids(server.container_ids([sandbox.id])))
        if len(pids) != 1:
            raise RuntimeError(f"expected one execd for {sandbox.id}, found {pids}")
        endpoint = await sandbox.get_endpoint(44772)
        target = Target(endpoint.endpoint, dict(endpoint.headers or {}), server.pid, pids[0])
        await _rounds({"sandbox": target}, rounds, runs, cold, interleave)
    finally:
        await sandboxes.delete(sandbox)
        await sandboxes.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cold", type=int, default=0)
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--old-src", help="with --standalone: a second execd from this src "
                        "directory (e.g. main's), alternated with this tree's")
    parser.add_argument("--interleave", action="store_true",
                        help="a direct run after each sandbox run, as bench code alternates")
    opts = parser.parse_args()
    if opts.standalone:
        _standalone(opts.rounds, opts.runs, opts.cold, opts.old_src, opts.interleave)
        return
    server = SandlotServer(warm_pool_size=1)
    server.start()
    try:
        asyncio.run(_in_sandbox(server, opts.rounds, opts.runs, opts.cold, opts.interleave))
    finally:
        server.stop()
        server.remove()


if __name__ == "__main__":
    main()
