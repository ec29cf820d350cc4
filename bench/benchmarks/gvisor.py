"""gVisor: create-to-Running and ``commands.run("true")`` on a runsc server, beside raw
``runsc run -d`` + ``runsc exec``; hibernate and resume of a sandbox holding 256 MiB, with
the host memory of its container before and after, beside raw ``runsc checkpoint`` /
``runsc restore`` of a container holding the same (with the flags sandlot passes).

Runs its own ``sandlot serve`` with ``[secure_runtime] type = "gvisor"`` (warm pool of 2); the
raw baselines use the gVisor platform that server chose.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from opensandbox import SandboxManager

from bench.baselines.runc import RuncBaseline
from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms
from bench.sdk import Sandboxes
from bench.server import SandlotServer
from sandlot.runtime.oci import runsc

BENCH = "gvisor"
KEYS = ("gvisor.create", "gvisor.true_rtt", "gvisor.hibernate", "gvisor.resume")
HIBERNATE_TARGET = Target("<=", 1000.0, "p50", "issue 10")
HOLD_256 = ("nohup python3 -c 'import time; b = bytearray(256 << 20); "
            "b[::4096] = b\"x\" * len(b[::4096]); time.sleep(86400)' >/dev/null 2>&1 &")
# The same in the raw baseline's container, which says when it holds it (/dev/shm is a tmpfs
# of runsc's default spec; the rootfs is read-only).
RAW_HOLD_256 = ("nohup python3 -c 'import time; b = bytearray(256 << 20); "
                "b[::4096] = b\"x\" * len(b[::4096]); open(\"/dev/shm/held\", \"w\").close(); "
                "time.sleep(86400)' >/dev/null 2>&1 &")


class RunscBaseline(RuncBaseline):
    """``runsc run -d`` / ``runsc exec`` on the same minimal bundle (gVisor's own network
    stack with no interface: ``--network=none``)."""

    _FLAGS = {"-d": "--detach", "-f": "--force"}  # runsc takes only the long forms
    platform = "ptrace"  # set to the server's (``runsc.resolve_platform``) before use

    def _runc(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.state), "--network=none",
                f"--platform={self.platform}", *(self._FLAGS.get(a, a) for a in args)]

    def hold_256(self, cid: str) -> None:
        """A process in ``cid`` that holds 256 MiB (every page touched), like the sandboxes'."""
        subprocess.run(self._runc("exec", cid, "sh", "-c", RAW_HOLD_256),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True, timeout=60)
        for _ in range(600):
            if subprocess.run(self._runc("exec", cid, "test", "-e", "/dev/shm/held"),
                              capture_output=True, timeout=60, check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the raw container's 256 MiB holder did not start")

    def checkpoint(self, cid: str, image_dir: Path, flags: tuple[str, ...]) -> float:
        """``runsc checkpoint``: seconds; the container stops (its state stays)."""
        t0 = time.perf_counter()
        subprocess.run(self._runc("checkpoint", *flags, "--image-path", str(image_dir), cid),
                       capture_output=True, check=True, timeout=120)
        return time.perf_counter() - t0

    def restore(self, cid: str, image_dir: Path, flags: tuple[str, ...]) -> float:
        """``runsc restore --detach`` of a checkpointed (and deleted) ``cid``: seconds."""
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as out:  # the sandbox keeps runsc's stdio: not a pipe
            proc = subprocess.run(self._runc("restore", "--detach", *flags, "--image-path",
                                             str(image_dir), "--bundle", str(self.bundle), cid),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  check=False, timeout=120)
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                out.seek(0)
                raise RuntimeError(f"runsc restore failed: "
                                   f"{out.read().decode(errors='replace')[-300:]}")
        self.running.add(cid)
        return elapsed


def _step_times(server: SandlotServer) -> list[str]:
    """The server's own split of each hibernation and restore (hibernate.py logs it)."""
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(" INFO ", 1)[-1] for line in text.splitlines()
            if " hibernated " in line or " restored " in line]


def _container_memory_mb(server: SandlotServer, sandbox_id: str) -> float:
    cid = server.container_ids([sandbox_id])[0]
    usage = f"/sys/fs/cgroup/memory/sandlot/{cid}/memory.usage_in_bytes"
    try:
        with open(usage) as fh:
            return int(fh.read()) / 1e6
    except OSError:
        return 0.0


async def run(env: BenchEnv) -> list[Row]:
    if shutil.which("runsc") is None:
        env.note("gvisor: runsc is not installed; rows skipped")
        return [Row(k, BENCH, k, "ms", None, note="runsc not installed") for k in KEYS]
    runs = 3 if env.quick else 20
    server = SandlotServer(image_cache=env.image_cache, warm_pool_size=2,
                           extra_config='\n[secure_runtime]\ntype = "gvisor"\n')
    await asyncio.to_thread(server.start)
    sandboxes = Sandboxes(server, "gvisor-bench")
    rows: list[Row] = []
    raw: RunscBaseline | None = None
    try:
        create_s, rtt = [], []
        for _ in range(runs):
            await asyncio.sleep(3.0)  # the warm pool refills between creates (runsc: ~1-2 s)
            sandbox, seconds = await sandboxes.create()
            create_s.append(seconds)
            await sandbox.commands.run("true")
            t0 = time.perf_counter()
            await sandbox.commands.run("true")
            rtt.append(time.perf_counter() - t0)
            await sandboxes.delete(sandbox)

        raw = RunscBaseline(env.rootfs(), env.workdir / "runsc", binary="runsc", prefix="gvb")
        # the platform the server runs (its default "auto"), so both sides compare alike
        raw.platform = await runsc.resolve_platform(raw.binary, "auto")
        raw.prepare()
        raw_run, raw_exec = [], []
        for _ in range(runs):
            cid, seconds = await asyncio.to_thread(raw.run_detached)
            raw_run.append(seconds)
            raw_exec.append(await asyncio.to_thread(raw.exec, cid, "true"))
            await asyncio.to_thread(raw.delete, cid)
        rows.append(Row("gvisor.create", BENCH, "create to Running (runsc)", "ms",
                        Measured("sandlot", ms(create_s)),
                        baselines=[Measured("runsc run -d", ms(raw_run))]))
        rows.append(Row("gvisor.true_rtt", BENCH, 'commands.run("true") (runsc)', "ms",
                        Measured("sandlot", ms(rtt)),
                        baselines=[Measured("runsc exec", ms(raw_exec))]))

        rows += await _hibernation_rows(env, server, sandboxes, raw)
    except Exception as exc:  # noqa: BLE001 - reported on the rows, the run goes on
        why = f"failed: {type(exc).__name__}: {exc}"[:300]
        env.note(f"gvisor: {why}; server log: {server.log_tail(5)}")
        done = {r.key for r in rows}
        rows += [Row(k, BENCH, k, "ms", None, note=why) for k in KEYS if k not in done]
    finally:
        if raw is not None:
            await asyncio.to_thread(raw.close)
        for line in _step_times(server):
            env.note(f"gvisor server: {line}")
        await sandboxes.delete_all()
        await sandboxes.aclose()
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.remove)
    return rows


async def _hibernation_rows(env: BenchEnv, server: SandlotServer, sandboxes: Sandboxes,
                            raw: RunscBaseline) -> list[Row]:
    """The hibernate/resume rows, each round beside a raw checkpoint/restore; a failure is
    reported on the rows (with its reason)."""
    hib: list[float] = []
    res: list[float] = []
    raw_ckpt: list[float] = []
    raw_restore: list[float] = []
    before: list[float] = []
    after: list[float] = []
    images = env.workdir / "runsc-images"
    try:
        manager = await SandboxManager.create(connection_config=sandboxes.config())
        try:
            for _ in range(2 if env.quick else 10):
                sandbox, _ = await sandboxes.create(
                    extensions={"sandlot.pause.mode": "hibernate"},
                    resource={"cpu": "1", "memory": "1Gi"})
                await sandbox.commands.run(HOLD_256)
                await asyncio.sleep(2.0)
                before.append(_container_memory_mb(server, sandbox.id))
                t0 = time.perf_counter()
                await manager.pause_sandbox(sandbox.id)
                hib.append(time.perf_counter() - t0)
                await asyncio.sleep(2.0)  # runsc's delete of the stopped sentry follows
                after.append(_container_memory_mb(server, sandbox.id))
                t0 = time.perf_counter()
                await manager.resume_sandbox(sandbox.id)
                res.append(time.perf_counter() - t0)
                await sandboxes.delete(sandbox)
                ckpt, restore, flags = await _raw_round(raw, images)
                raw_ckpt.append(ckpt)
                raw_restore.append(restore)
        finally:
            await manager.close()
    except Exception as exc:  # noqa: BLE001 - reported on the rows, the run goes on
        why = f"failed after {len(hib)} round(s): {type(exc).__name__}: {exc}"[:300]
        env.note(f"gvisor hibernation: {why}")
        return [Row(k, BENCH, k, "ms", None, note=why)
                for k in ("gvisor.hibernate", "gvisor.resume")]
    mem = (f"container memory before {sum(before) / len(before):.0f} MB, "
           f"after hibernate {sum(after) / len(after):.0f} MB")
    how = " ".join(flags.checkpoint) or "compressed (this runsc has no other way)"
    return [Row("gvisor.hibernate", BENCH, "hibernate, 256 MiB held (API pause)", "ms",
                Measured("sandlot", ms(hib)), target=HIBERNATE_TARGET,
                baselines=[Measured("runsc checkpoint", ms(raw_ckpt))],
                note=f"{mem}; checkpoint {how}; {flags.version}, platform {raw.platform}"),
            Row("gvisor.resume", BENCH, "resume from hibernation (API resume)", "ms",
                Measured("sandlot", ms(res)), target=HIBERNATE_TARGET,
                baselines=[Measured("runsc restore", ms(raw_restore))],
                note=f"restore {' '.join(flags.restore) or 'without flags'}")]


async def _raw_round(raw: RunscBaseline, images: Path) -> tuple[float, float, runsc.SaveOptions]:
    """One raw ``runsc checkpoint`` and ``runsc restore`` of a container holding 256 MiB, with
    the flags sandlot's hibernation passes (the stopped container's delete in between, as
    sandlot's resume waits for it too)."""
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    flags = await runsc.save_options(raw.binary, images)
    cid, _ = await asyncio.to_thread(raw.run_detached)
    try:
        await asyncio.to_thread(raw.hold_256, cid)
        await asyncio.sleep(2.0)
        ckpt = await asyncio.to_thread(raw.checkpoint, cid, images, flags.checkpoint)
        await asyncio.to_thread(raw.delete, cid)
        restore = await asyncio.to_thread(raw.restore, cid, images, flags.restore)
        await asyncio.to_thread(raw.exec, cid, "true")  # it runs again
    finally:
        await asyncio.to_thread(raw.delete, cid)
        shutil.rmtree(images, ignore_errors=True)
    return ckpt, restore, flags
