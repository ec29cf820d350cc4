"""OciRuntime create-to-/ping and delete latency, cold and from the warm pool.

Not a benchmark of the server (``bench/`` is): it drives ``OciRuntime`` directly so the
runtime's share is visible. Needs root and runc. Usage:

    .venv/bin/python tools/measure_create.py [--n 10] [--concurrent 10] [--images DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal

from sandlot.config import Config
from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from sandlot.runtime import execd_client
from sandlot.runtime.base import ImageRef, SandboxSpec
from sandlot.runtime.oci import OciRuntime


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _row(name: str, xs: list[float]) -> str:
    ms = [x * 1000 for x in xs]
    return (f"{name:34s} n={len(ms):3d}  p50={statistics.median(ms):7.1f} ms  "
            f"p99={_pct(ms, 0.99):7.1f} ms  max={max(ms):7.1f} ms")


def _userns(value: str) -> bool | Literal["auto"]:
    return "auto" if value == "auto" else value == "true"


async def _one(rt: OciRuntime, image: Image) -> tuple[str, float]:
    sid = f"m-{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    await rt.create(SandboxSpec(sandbox_id=sid, image=ImageRef(image.name), entrypoint=[],
                                execd_token="t-" + sid))
    await execd_client.wait_ready(lambda: rt.connect(sid, rt.execd_port), "t-" + sid, 60)
    return sid, time.perf_counter() - t0


async def _delete(rt: OciRuntime, sid: str) -> float:
    t0 = time.perf_counter()
    await rt.delete(sid)
    return time.perf_counter() - t0


async def _serial(rt: OciRuntime, image: Image, n: int, warm: bool) -> tuple[list[float],
                                                                            list[float]]:
    creates, deletes = [], []
    for _ in range(n):
        if warm:
            await rt.pool.wait_full(image.name)
        sid, dt = await _one(rt, image)
        creates.append(dt)
        deletes.append(await _delete(rt, sid))
    return creates, deletes


async def _concurrent(rt: OciRuntime, image: Image, n: int, warm: bool) -> list[float]:
    if warm:
        await rt.pool.wait_full(image.name)
    results = await asyncio.gather(*(_one(rt, image) for _ in range(n)))
    await asyncio.gather(*(rt.delete(sid) for sid, _ in results))
    return [dt for _, dt in results]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--concurrent", type=int, default=10)
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--cold-only", action="store_true")
    ap.add_argument("--user-namespaces", choices=["auto", "true", "false"], default="auto",
                    help="[runtime] user_namespaces (compare the cost of per-sandbox userns)")
    ap.add_argument("--images", default=os.environ.get("SANDLOT_TEST_IMAGES",
                                                       "/var/tmp/sandlot-test/images"))
    ap.add_argument("--execd-launch", choices=["exec", "zygote"], default="exec",
                    help="[runtime] execd_launch")
    a = ap.parse_args()
    store = ImageStore(Path(a.images))
    image = await store.build("base", if_missing=True)
    data = Path(tempfile.mkdtemp(prefix="slm", dir="/tmp"))
    try:
        cold_cfg = Config(data_dir=data)
        cold_cfg.runtime.warm_pool_size = 0
        cold_cfg.runtime.user_namespaces = _userns(a.user_namespaces)
        cold_cfg.runtime.execd_launch = a.execd_launch
        rt = await OciRuntime.open(cold_cfg, images=store)
        c, d = await _serial(rt, image, a.n, warm=False)
        print(_row("cold create->/ping (serial)", c))
        print(_row("cold delete", d))
        print(_row(f"cold create->/ping ({a.concurrent} at once)",
                   await _concurrent(rt, image, a.concurrent, warm=False)))
        await rt.close()

        for size in [] if a.cold_only else sorted({a.pool_size, a.concurrent}):
            cfg = Config(data_dir=data)
            cfg.runtime.warm_pool_size = size
            cfg.runtime.user_namespaces = _userns(a.user_namespaces)
            cfg.runtime.execd_launch = a.execd_launch
            cfg.runtime.warm_pool_images = [image.name]
            rt = await OciRuntime.open(cfg, images=store)
            await rt.prewarm(image)
            if size == a.pool_size:
                c, d = await _serial(rt, image, a.n, warm=True)
                print(_row(f"warm create->/ping (serial, pool {size})", c))
                print(_row("warm delete", d))
            print(_row(f"warm create->/ping ({a.concurrent} at once, pool {size})",
                       await _concurrent(rt, image, a.concurrent, warm=True)))
            await rt.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
