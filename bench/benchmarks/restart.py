"""Server restart with sandboxes present: ``kill -9`` of ``sandlot serve`` (a crash: its
warm containers are left behind, a create may be cut short) beside a clean stop (SIGTERM,
nothing left behind but the sandboxes), each followed by a start on the same data dir.

Two figures per restart: from the new process's start until ``/health`` answers 200, and
until a create issued then is Running (``first create``). The server has a warm pool of 2
and ``SANDBOXES`` sandboxes, one of them paused. Full runs only: the ``--quick`` smoke run
reports the rows as skipped (it is part of ``make test``, which this would slow by ~30 s).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from bench.env import BenchEnv
from bench.results import Measured, Row, skipped
from bench.server import SandlotServer

BENCH = "restart"
KEYS = ("restart.healthy", "restart.first_create")
SANDBOXES = 8
RUNS = 5
BODY = {"image": {"uri": "base"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 1800,
        "resourceLimits": {"cpu": "250m", "memory": "128Mi"}}
LABELS = {"restart.healthy": "restart to /health 200, after kill -9 vs after a clean stop",
          "restart.first_create": "restart to a first create Running, kill -9 vs clean stop"}


def _client(server: SandlotServer) -> httpx.Client:
    return httpx.Client(base_url=f"{server.base_url}/v1", timeout=120,
                        headers={"OPEN-SANDBOX-API-KEY": server.api_key})


def _wait_state(c: httpx.Client, sid: str, state: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.get(f"/sandboxes/{sid}")
        if r.status_code == 200 and r.json()["status"]["state"] == state:
            return
        time.sleep(0.01)
    raise RuntimeError(f"sandbox {sid} did not become {state}")


def _create(c: httpx.Client) -> str:
    r = c.post("/sandboxes", json=BODY)
    r.raise_for_status()
    sid = str(r.json()["id"])
    _wait_state(c, sid, "Running")
    return sid


def _restart(server: SandlotServer, crash: bool) -> tuple[float, float]:
    """Stop (kill -9 or SIGTERM) and start again: seconds to healthy, to a first create."""
    if crash:
        server.kill9()
    else:
        server.stop()
    t0 = time.monotonic()
    healthy = server.relaunch()
    with _client(server) as c:
        sid = _create(c)
        first = time.monotonic() - t0
        c.delete(f"/sandboxes/{sid}").raise_for_status()
    return healthy, first


def _measure(env: BenchEnv, runs: int) -> dict[str, list[float]]:
    server = SandlotServer(image_cache=env.server.image_cache, warm_pool_size=2,
                           extra_config=env.server.extra_config)
    out: dict[str, list[float]] = {"kill9.healthy": [], "kill9.first": [],
                                   "stop.healthy": [], "stop.first": []}
    try:
        server.start()
        with _client(server) as c:
            ids = [_create(c) for _ in range(SANDBOXES)]
            c.post(f"/sandboxes/{ids[0]}/pause").raise_for_status()
            _wait_state(c, ids[0], "Paused")
        for _ in range(runs):  # alternated, so that load drifts hit both alike
            for kind in ("kill9", "stop"):
                healthy, first = _restart(server, crash=kind == "kill9")
                out[f"{kind}.healthy"].append(healthy * 1000)
                out[f"{kind}.first"].append(first * 1000)
        with _client(server) as c:
            for sid in ids:
                c.delete(f"/sandboxes/{sid}")
    finally:
        server.stop()
        server.remove()
    return out


async def run(env: BenchEnv) -> list[Row]:
    if env.quick:
        return [skipped(k, BENCH, LABELS[k], "ms", "full runs only (restarts take seconds)")
                for k in KEYS]
    m = await asyncio.to_thread(_measure, env, RUNS)
    note = (f"{SANDBOXES} sandboxes (1 paused), warm pool of 2; {RUNS} restarts of each kind, "
            "alternated")
    return [
        Row(key="restart.healthy", bench=BENCH, label=LABELS["restart.healthy"], unit="ms",
            sandlot=Measured("after kill -9", m["kill9.healthy"]),
            baselines=[Measured("after a clean stop", m["stop.healthy"])], note=note),
        Row(key="restart.first_create", bench=BENCH, label=LABELS["restart.first_create"],
            unit="ms", sandlot=Measured("after kill -9", m["kill9.first"]),
            baselines=[Measured("after a clean stop", m["stop.first"])], note=note),
    ]
