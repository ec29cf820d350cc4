"""What networking adds to a create, measured at the runtime (no HTTP, no SDK).

Two ``OciRuntime``s in one process, each with a warm pool of the base image: one with
``[network] mode = "isolated"``, one with ``"none"``. Before every measured create both
pools are full again (no refill overlaps it); the creates of a round (off, on, on with a
deny+allow policy) rotate their order per round, so each kind takes each position equally
often. Printed: p50/p90 of each, and of the pairwise differences. ``--cold``: both runtimes
without a warm pool, so every create sets its network up (namespace, veth, nft chain, DNS
filter) inside the measured time. Runs inside the test namespaces of ``tests/net`` (a
process started in the server's namespace): nothing touches the machine's own. As root:

    PYTHONPATH=. .venv/bin/python tools/measure_claim_network.py --n 30 [--cold]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.net.testhosts import HOST, nsenter, test_network

POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "allowed.test"}]}


def _p90(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.9))]


def _row(label: str, values: list[float]) -> str:
    return (f"{label:<34} n {len(values):3d}  p50 {statistics.median(values):7.2f} ms  "
            f"p90 {_p90(values):7.2f} ms")


async def _measure(n: int, images: str, cold: bool) -> None:
    # Imported here, inside the server's namespace (libnftables binds its socket to the
    # namespace it is made in).
    from sandlot.config import Config
    from sandlot.images.store import ImageStore
    from sandlot.runtime import execd_client
    from sandlot.runtime.base import ImageRef, SandboxSpec
    from sandlot.runtime.oci import OciRuntime

    store = ImageStore(Path(images))
    image = await store.build("base", if_missing=True)
    dirs = [Path(tempfile.mkdtemp(prefix="slcn", dir="/tmp")) for _ in range(2)]
    runtimes = []
    try:
        for data, mode in zip(dirs, ("isolated", "none"), strict=True):
            cfg = Config.model_validate({
                "data_dir": str(data),
                "network": {"mode": mode, "dns_servers": [HOST]},
                "runtime": {"warm_pool_size": 0 if cold else 2,
                            "warm_pool_images": [image.name]}})
            rt = await OciRuntime.open(cfg, images=store)
            runtimes.append(rt)
            await rt.prewarm(ImageRef(image.name))
        on_rt, off_rt = runtimes

        async def one(rt: OciRuntime, policy: object) -> float:
            if not cold:
                await on_rt.pool.wait_full(image.name)
                await off_rt.pool.wait_full(image.name)
            sid = f"m-{uuid.uuid4().hex[:12]}"
            t0 = time.perf_counter()
            await rt.create(SandboxSpec(sandbox_id=sid, image=ImageRef(image.name),
                                        entrypoint=[], execd_token="t-" + sid,
                                        network_policy=policy))  # type: ignore[arg-type]
            await execd_client.wait_ready(lambda: rt.connect(sid, rt.execd_port), "t-" + sid,
                                          60)
            took = (time.perf_counter() - t0) * 1000
            await rt.delete(sid)
            return took

        from sandlot.server.spec_parts import network_policy
        policy = network_policy(POLICY)
        on: list[float] = []
        off: list[float] = []
        with_policy: list[float] = []
        for i in range(n):
            order = [(off, off_rt, None), (on, on_rt, None), (with_policy, on_rt, policy)]
            turn = i % 3  # each kind takes each position equally often
            for samples, rt, pol in order[turn:] + order[:turn]:
                samples.append(await one(rt, pol))
        kind = "cold" if cold else "warm"
        print(_row(f"{kind} create, networking off", off))
        print(_row(f"{kind} create, networking on", on))
        print(_row(f"{kind} create, on + deny policy", with_policy))
        print(_row("on - off (pairwise)", [a - b for a, b in zip(on, off, strict=True)]))
        print(_row("policy - off (pairwise)",
                   [a - b for a, b in zip(with_policy, off, strict=True)]))
    finally:
        for rt in runtimes:
            await rt.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--images", default=os.environ.get("SANDLOT_TEST_IMAGES",
                                                       "/var/tmp/sandlot-test/images"))
    ap.add_argument("--cold", action="store_true",
                    help="no warm pools: each create sets its network up")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        asyncio.run(_measure(a.n, a.images, a.cold))
        return 0
    work = Path(tempfile.mkdtemp(prefix="slcn-"))
    try:
        with test_network(work) as lab:
            return subprocess.run(nsenter(lab.server_ns, sys.executable, *sys.argv,
                                          "--inner")).returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
