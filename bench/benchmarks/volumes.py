"""Volumes and the disk cap (issue 13): I/O on a pvc volume and on a capped writable layer.

The same ``dd`` (write with ``conv=fdatasync``, then read back) runs inside a sandbox on a
pvc volume, inside a sandbox whose writable layer is capped (``ephemeral-storage``: its own
loop-mounted ext4), and on the host in a directory of the server's data dir (same file
system as the pvc), each sandbox run paired with host runs just before it: one by the bench
process as it is, and one moved into the sandbox's own cgroups first (cpu, cpuacct, memory,
blkio), so it gets the sandbox's CPU share and memory accounting. On a shared machine the
sandboxes' common cgroup parent competes with everything else, which the plain host run does
not; the in-cgroup run leaves only the I/O path (bind mount, namespaces, seccomp) as the
difference, and is the baseline of the target (issue 13: volume throughput >= 80 % of the
host's). Also the create time with a cap that the warm pool does not hold (a cold create
plus mkfs and mount).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from opensandbox import Sandbox
from opensandbox.models.sandboxes import PVC, Volume

from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms
from sandlot.runtime.oci import cgroups

BENCH = "volumes"
KEYS = ("volumes.write", "volumes.read", "volumes.capped_layer_write", "volumes.create_capped")
_DD_RATE = re.compile(r"copied, ([0-9.]+) s")
_CONTROLLERS = ("cpu", "cpuacct", "cpu,cpuacct", "memory", "blkio")


def sandbox_cgroups(env: BenchEnv, sandbox_id: str) -> list[Path]:
    """The sandbox's cgroup dirs a host process may join for a fair baseline: cpu and memory
    (v1, where they exist) or its v2 dir. Its container may be a claimed warm one."""
    dirs = cgroups.sandbox_cgroup_dirs(env.server.container_ids([sandbox_id])[0])
    if cgroups.is_unified_only():
        return dirs
    return [d for d in dirs if d.parent.parent.name in _CONTROLLERS]


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


async def _io(sandbox: Sandbox, path: str, size: int, runs: int, host_path: str,
              cgroup_dirs: list[Path]) -> dict[str, list[float]]:
    """MB/s of ``write``/``read`` in the sandbox, and of the host's runs just before each:
    ``host_write``/``host_read`` (the bench process) and ``cg_write``/``cg_read`` (in the
    sandbox's cgroups), so all see the same (noisy) disk and machine."""
    out: dict[str, list[float]] = {k: [] for k in (
        "write", "read", "host_write", "host_read", "cg_write", "cg_read")}
    w, r = _dd(size, path)
    for _ in range(runs):
        hw, hr = _host_io(host_path, size)
        out["host_write"].append(hw)
        out["host_read"].append(hr)
        cw, cr = _host_io(host_path, size, cgroup_dirs)
        out["cg_write"].append(cw)
        out["cg_read"].append(cr)
        out["write"].append(_rate(await _in_sandbox(sandbox, w), size))
        out["read"].append(_rate(await _in_sandbox(sandbox, r), size))
        await _in_sandbox(sandbox, f"rm -f {path}")
    return out


def _host_io(path: str, size: int, cgroup_dirs: list[Path] | None = None
             ) -> tuple[float, float]:
    """One host write and read; in ``cgroup_dirs`` (the shell joins them, then runs dd)."""
    join = "".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))} && "
                   for d in cgroup_dirs or [])
    rates = []
    for cmd in _dd(size, path):
        p = subprocess.run(["sh", "-c", join + cmd], capture_output=True, text=True,
                           check=True)
        rates.append(_rate(p.stdout + p.stderr, size))
    subprocess.run(["rm", "-f", path], check=True)
    return rates[0], rates[1]


async def run(env: BenchEnv) -> list[Row]:
    size, runs, creates = (64, 2, 2) if env.quick else (256, 5, 5)
    host_dir = env.server.data_dir / "bench-volume-host"
    host_dir.mkdir(exist_ok=True)
    vol: dict[str, list[float]] = {}
    cap: dict[str, list[float]] = {}
    capped_create: list[float] = []
    plain_create: list[float] = []
    try:
        sandbox, _ = await env.sandboxes.create(volumes=[Volume(
            name="v", mount_path="/vol",
            pvc=PVC(claim_name="bench-volume", delete_on_sandbox_termination=True))])
        try:
            vol = await _io(sandbox, "/vol/f", size, runs, str(host_dir / "f"),
                            sandbox_cgroups(env, sandbox.id))
        finally:
            await env.sandboxes.delete(sandbox)
        cap_size = f"{size * 4}Mi"
        for i in range(creates):
            if time.monotonic() > env.deadline:
                break
            sandbox, took = await env.sandboxes.create(
                resource={"cpu": "1", "memory": "512Mi", "ephemeral-storage": cap_size})
            capped_create.append(took)
            try:
                if i == 0:
                    cap = await _io(sandbox, "/workspace/f", size, runs,
                                    str(host_dir / "f"), sandbox_cgroups(env, sandbox.id))
            finally:
                await env.sandboxes.delete(sandbox)
            sandbox, took = await env.sandboxes.create()
            plain_create.append(took)
            await env.sandboxes.delete(sandbox)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    host = "host dd (data dir's file system)"
    in_cg = "host dd in the sandbox's cgroups"

    def goal(samples: list[float]) -> Target:
        p50 = sorted(samples)[len(samples) // 2] if samples else 0
        return Target(">=", round(0.8 * p50, 1), source="issue 13: >= 80 % of the host "
                      "(in the sandbox's cgroups)")

    def row(key: str, label: str, got: dict[str, list[float]], kind: str,
            target: bool) -> Row:
        return Row(key, BENCH, label, "MB/s", Measured("sandlot", got.get(kind, [])),
                   target=goal(got.get(f"cg_{kind}", [])) if target else None,
                   baselines=[Measured(in_cg, got.get(f"cg_{kind}", [])),
                              Measured(host, got.get(f"host_{kind}", []))],
                   higher_is_better=True)

    return [
        row("volumes.write", f"pvc volume write, {size} MiB (fdatasync)", vol, "write", True),
        row("volumes.read", f"pvc volume read, {size} MiB (page cache)", vol, "read", True),
        row("volumes.capped_layer_write", f"capped writable layer write, {size} MiB "
            "(loop ext4)", cap, "write", False),
        Row("volumes.create_capped", BENCH,
            "create with a non-default ephemeral-storage (cold + mkfs + mount)", "ms",
            Measured("sandlot", ms(capped_create)),
            baselines=[Measured("create without a cap (warm pool)", ms(plain_create))]),
    ]
