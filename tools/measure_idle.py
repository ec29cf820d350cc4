"""Idle sandboxes through ``OciRuntime``: each execd's USS (and what it is made of) and the
CPU the idle execds (and the zygote) use over a window.

Not a benchmark of the server (``bench density`` is): it drives ``OciRuntime`` directly so
execd's share is visible without the API server's. Needs root and runc. Usage:

    .venv/bin/python tools/measure_idle.py [--n 20] [--settle 10] [--window 30]
        [--execd-launch zygote|exec] [--image base] [--smaps]

``--smaps`` adds, summed over the execds, the private (unshared) memory by kind of mapping:
the pages inherited from the zygote (by address range, written since the fork), the anonymous
memory mapped after the fork, the heap, the stacks and the shared libraries' data.
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
from collections import defaultdict
from pathlib import Path
from typing import Literal

import psutil

from sandlot.config import Config
from sandlot.images.store import ImageStore
from sandlot.runtime import execd_client
from sandlot.runtime.base import ImageRef, SandboxSpec
from sandlot.runtime.oci import OciRuntime

MB = 1e6


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _userns(value: str) -> bool | Literal["auto"]:
    return "auto" if value == "auto" else value == "true"


def _mappings(pid: int) -> list[tuple[int, int, str, dict[str, int]]]:
    """(start, end, name, fields in kB) of each mapping in /proc/<pid>/smaps."""
    out: list[tuple[int, int, str, dict[str, int]]] = []
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head, _, rest = line.partition(" ")
            if "-" in head and not head.endswith(":"):
                lo, hi = head.split("-")
                parts = rest.split(None, 4)
                name = parts[4].strip() if len(parts) > 4 else ""
                out.append((int(lo, 16), int(hi, 16), name, {}))
            elif head.endswith(":") and out:
                value = rest.split()
                if value and value[0].isdigit():
                    out[-1][3][head[:-1]] = int(value[0])
    return out


def _kind(name: str, inherited: bool) -> str:
    if name == "[heap]":
        return "heap (brk)" + (" inherited" if inherited else " new")
    if name.startswith("[stack"):
        return "stack"
    if name.startswith("["):
        return name
    if not name:
        return "anonymous " + ("inherited (arenas etc.)" if inherited else "mapped after fork")
    if ".so" in name or "python3" in name or "ld-linux" in name:
        return "shared objects / interpreter"
    return "other files"


def smaps_breakdown(pids: list[int], zygote: int | None) -> dict[str, list[float]]:
    """kind -> each execd's private kB of that kind."""
    ranges: set[tuple[int, int]] = set()
    if zygote is not None:
        ranges = {(lo, hi) for lo, hi, _, _ in _mappings(zygote)}
    starts = {lo for lo, _ in ranges}
    per: dict[str, list[float]] = defaultdict(list)
    for pid in pids:
        sums: dict[str, float] = defaultdict(float)
        try:
            maps = _mappings(pid)
        except OSError:
            continue
        for lo, _hi, name, f in maps:
            private = f.get("Private_Dirty", 0) + f.get("Private_Clean", 0)
            sums[_kind(name, lo in starts)] += private
            sums["total"] += private
        for k, v in sums.items():
            per[k].append(v)
    return per


async def _one(rt: OciRuntime, image: str) -> str:
    sid = f"mi-{uuid.uuid4().hex[:12]}"
    await rt.create(SandboxSpec(sandbox_id=sid, image=ImageRef(image), entrypoint=[],
                                execd_token="t-" + sid))
    await execd_client.wait_ready(lambda: rt.connect(sid, rt.execd_port), "t-" + sid, 60)
    return sid


def _execds(sids: list[str]) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not any(a in ("sandlot.execd", "sandlot.execd.zygote") for a in cmd):
            continue
        try:
            cg = Path(f"/proc/{proc.info['pid']}/cgroup").read_text()
        except OSError:
            continue
        if any(s in cg for s in sids):
            found.append(int(proc.info["pid"]))
    # The top execd of each sandbox (not its children, e.g. a kernel).
    top = []
    for pid in found:
        try:
            if psutil.Process(pid).ppid() not in found:
                top.append(pid)
        except psutil.Error:
            pass
    return sorted(top)


def _cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _uss(pid: int) -> float:
    try:
        return float(psutil.Process(pid).memory_full_info().uss) / MB
    except psutil.Error:
        return 0.0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--image", default="base")
    ap.add_argument("--execd-launch", choices=["exec", "zygote"], default="zygote")
    ap.add_argument("--user-namespaces", choices=["auto", "true", "false"], default="auto")
    ap.add_argument("--smaps", action="store_true")
    ap.add_argument("--images", default=os.environ.get("SANDLOT_TEST_IMAGES",
                                                       "/var/tmp/sandlot-test/images"))
    a = ap.parse_args()
    store = ImageStore(Path(a.images))
    image = await store.build(a.image, if_missing=True)
    data = Path(tempfile.mkdtemp(prefix="slmi", dir="/tmp"))
    sids: list[str] = []
    rt = None
    try:
        cfg = Config(data_dir=data)
        cfg.runtime.warm_pool_size = 0
        cfg.runtime.execd_launch = a.execd_launch
        cfg.runtime.user_namespaces = _userns(a.user_namespaces)
        rt = await OciRuntime.open(cfg, images=store)
        for _ in range(a.n):
            sids.append(await _one(rt, image.name))
        await asyncio.sleep(a.settle)
        pids = _execds(sids)
        zygote = getattr(getattr(rt, "zygote", None), "pid", None)
        ussv = [_uss(p) for p in pids]
        print(f"execd_launch={a.execd_launch} image={a.image} execds={len(pids)}/{a.n} "
              f"load={os.getloadavg()[0]:.1f}")
        print(f"USS MB: p50 {statistics.median(ussv):.2f}  p90 {_pct(ussv, 0.9):.2f}  "
              f"max {max(ussv):.2f}")
        rssv = [psutil.Process(p).memory_info().rss / MB for p in pids]
        pssv = [psutil.Process(p).memory_full_info().pss / MB for p in pids]
        print(f"RSS MB (shared pages counted in full): p50 {statistics.median(rssv):.2f}; "
              f"PSS MB (shared pages split): p50 {statistics.median(pssv):.2f}")
        if a.smaps:
            for kind, vals in sorted(smaps_breakdown(pids, zygote).items()):
                print(f"  {kind:40s} p50 {statistics.median(vals) / 1000:6.2f} MB  "
                      f"p90 {_pct(vals, 0.9) / 1000:6.2f} MB")
        watched = [*pids, *([zygote] if zygote else [])]
        before = _cpu(watched)
        t0 = time.perf_counter()
        await asyncio.sleep(a.window)
        after = _cpu(watched)
        wall = time.perf_counter() - t0
        used = sum(after[p] - before[p] for p in after if p in before)
        print(f"idle CPU over {wall:.0f} s: {100 * used / wall:.3f} % of one core "
              f"({len(pids)} execds{' + zygote' if zygote else ''}; "
              f"{1000 * used / wall / max(1, len(pids)):.3f} ms/s each)")
    finally:
        if rt is not None:
            await asyncio.gather(*(rt.delete(s) for s in sids), return_exceptions=True)
            await rt.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
