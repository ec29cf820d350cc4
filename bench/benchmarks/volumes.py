"""Volumes and the disk cap (issue 13): I/O on a pvc volume and on a capped writable layer.

The same ``dd`` (write with ``conv=fdatasync``, then read back) runs inside a sandbox on a
pvc volume, inside a sandbox whose writable layer is capped (``ephemeral-storage``: its own
loop-mounted ext4), and on the host in a directory of the server's data dir (same file
system as the pvc), each sandbox run paired with a host run just before it. Target
(issue 13): volume throughput >= 80 % of the host's. Also the create time with a cap that
the warm pool does not hold (a cold create plus mkfs and mount).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

from opensandbox import Sandbox
from opensandbox.models.sandboxes import PVC, Volume

from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms

BENCH = "volumes"
KEYS = ("volumes.write", "volumes.read", "volumes.capped_layer_write", "volumes.create_capped")
_DD_RATE = re.compile(r"copied, ([0-9.]+) s")


def _dd(size_mib: int, path: str) -> tuple[str, str]:
    write = f"dd if=/dev/zero of={path} bs=1M count={size_mib} conv=fdatasync 2>&1"
    read = f"dd if={path} of=/dev/null bs=1M 2>&1"
    return write, read


def _rate(output: str, size_mib: int) -> float:
    m = _DD_RATE.search(output)
    if m is None or float(m.group(1)) <= 0:
        raise RuntimeError(f"unexpected dd output: {output[-300:]!r}")
    return size_mib * 2**20 / float(m.group(1)) / 1e6


async def _in_sandbox(sandbox: Sandbox, cmd: str) -> str:
    ex = await sandbox.commands.run(cmd)
    return "\n".join(m.text for m in [*ex.logs.stdout, *ex.logs.stderr])


async def _io(sandbox: Sandbox, path: str, size: int, runs: int,
              host_path: str | None = None) -> tuple[list[float], ...]:
    """(write, read, host write, host read) MB/s; with ``host_path`` each sandbox run is
    paired with a host run just before it, so both see the same (noisy) disk."""
    writes, reads, host_w, host_r = [], [], [], []
    w, r = _dd(size, path)
    for _ in range(runs):
        if host_path is not None:
            hw, hr = _host_io(host_path, size, 1)
            host_w += hw
            host_r += hr
        writes.append(_rate(await _in_sandbox(sandbox, w), size))
        reads.append(_rate(await _in_sandbox(sandbox, r), size))
        await _in_sandbox(sandbox, f"rm -f {path}")
    return writes, reads, host_w, host_r


def _host_io(path: str, size: int, runs: int) -> tuple[list[float], list[float]]:
    writes, reads = [], []
    w, r = _dd(size, path)
    for _ in range(runs):
        for cmd, out in ((w, writes), (r, reads)):
            p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True)
            out.append(_rate(p.stdout + p.stderr, size))
        subprocess.run(["rm", "-f", path], check=True)
    return writes, reads


async def run(env: BenchEnv) -> list[Row]:
    size, runs, creates = (64, 2, 2) if env.quick else (256, 5, 5)
    host_dir = env.server.data_dir / "bench-volume-host"
    host_dir.mkdir(exist_ok=True)
    vol_w: list[float] = []
    vol_r: list[float] = []
    cap_w: list[float] = []
    cap_host_w: list[float] = []
    host_w: list[float] = []
    host_r: list[float] = []
    capped_create: list[float] = []
    plain_create: list[float] = []
    try:
        sandbox, _ = await env.sandboxes.create(volumes=[Volume(
            name="v", mount_path="/vol",
            pvc=PVC(claim_name="bench-volume", delete_on_sandbox_termination=True))])
        try:
            vol_w, vol_r, host_w, host_r = await _io(sandbox, "/vol/f", size, runs,
                                                     str(host_dir / "f"))
        finally:
            await env.sandboxes.delete(sandbox)
        cap = f"{size * 4}Mi"
        for i in range(creates):
            if time.monotonic() > env.deadline:
                break
            sandbox, took = await env.sandboxes.create(
                resource={"cpu": "1", "memory": "512Mi", "ephemeral-storage": cap})
            capped_create.append(took)
            try:
                if i == 0:
                    cap_w, _, cap_host_w, _ = await _io(sandbox, "/workspace/f", size, runs,
                                                        str(host_dir / "f"))
            finally:
                await env.sandboxes.delete(sandbox)
            sandbox, took = await env.sandboxes.create()
            plain_create.append(took)
            await env.sandboxes.delete(sandbox)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    host = "host dd (data dir's file system)"
    goal = Target(">=", 0.8 * (sorted(host_w)[len(host_w) // 2] if host_w else 0),
                  source="issue 13: >= 80 % of the host")
    return [
        Row("volumes.write", BENCH, f"pvc volume write, {size} MiB (fdatasync)", "MB/s",
            Measured("sandlot", vol_w), target=goal, baselines=[Measured(host, host_w)],
            higher_is_better=True),
        Row("volumes.read", BENCH, f"pvc volume read, {size} MiB (page cache)", "MB/s",
            Measured("sandlot", vol_r), baselines=[Measured(host, host_r)],
            higher_is_better=True),
        Row("volumes.capped_layer_write", BENCH,
            f"capped writable layer write, {size} MiB (loop ext4)", "MB/s",
            Measured("sandlot", cap_w), baselines=[Measured(host, cap_host_w)],
            higher_is_better=True),
        Row("volumes.create_capped", BENCH,
            "create with a non-default ephemeral-storage (cold + mkfs + mount)", "ms",
            Measured("sandlot", ms(capped_create)),
            baselines=[Measured("create without a cap (warm pool)", ms(plain_create))]),
    ]
