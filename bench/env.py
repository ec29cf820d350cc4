"""What every benchmark gets: the server, the SDK helper, the scale, and lazy baselines."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from bench.baselines.docker import DockerBaseline, DockerUnavailable
from bench.baselines.runc import RuncBaseline
from bench.procs import execd_pids
from bench.profiling import Profiler
from bench.rootfs import Rootfs, RootfsUnavailable
from bench.sdk import Sandboxes
from bench.server import SandlotServer
from sandlot.runtime.oci import cgroups


@dataclass(frozen=True)
class Scale:
    """How much load each benchmark makes (every loop is bounded by these)."""

    create_serial: int
    create_concurrency: tuple[tuple[int, int], ...]  # (concurrent creates, rounds)
    burst_pause: float  # seconds before each concurrent burst (the warm pool refills)
    command_runs: int
    first_byte_runs: int
    stream_bytes: int
    stream_runs: int
    # The SDK's row: its per-event parse runs ~4 MB/s, so 256 MiB would take a minute to say
    # what a few seconds say (it has no target; the raw row measures execd)
    sdk_stream_bytes: int
    small_file_runs: int
    large_file_bytes: int
    large_file_runs: int
    dir_entries: int
    dir_runs: int
    code_runs: int
    context_runs: int
    plot_runs: int
    density_steps: tuple[int, ...]
    docker_density: int
    proxy_runs: int
    proxy_download_bytes: int
    settle_seconds: float
    idle_window_seconds: float  # density: the window idle CPU is measured over
    bench_timeout: float  # a benchmark that runs longer is cancelled (and cleaned up)


FULL = Scale(
    create_serial=30, create_concurrency=((10, 3), (50, 3), (100, 3)), burst_pause=4.0,
    command_runs=200,
    first_byte_runs=30, stream_bytes=256 << 20, stream_runs=3, sdk_stream_bytes=16 << 20,
    small_file_runs=30,
    large_file_bytes=1 << 30, large_file_runs=2, dir_entries=10_000, dir_runs=5,
    code_runs=100, context_runs=8, plot_runs=10, density_steps=(10, 50, 100),
    docker_density=10, proxy_runs=100, proxy_download_bytes=64 << 20, settle_seconds=3.0,
    idle_window_seconds=20.0, bench_timeout=300.0,
)
QUICK = Scale(
    create_serial=3, create_concurrency=((2, 1), (3, 1)), burst_pause=0.5, command_runs=10,
    first_byte_runs=3, stream_bytes=4 << 20, stream_runs=1, sdk_stream_bytes=4 << 20,
    small_file_runs=3,
    large_file_bytes=16 << 20, large_file_runs=1, dir_entries=500, dir_runs=2,
    code_runs=5, context_runs=2, plot_runs=2, density_steps=(2, 4),
    docker_density=2, proxy_runs=5, proxy_download_bytes=4 << 20, settle_seconds=0.5,
    idle_window_seconds=2.0, bench_timeout=120.0,
)


BURST_SECONDS = 1.2  # time allowed per create of a SANDLOT_BENCH_BURSTS burst (loaded VM)


def with_bursts(scale: Scale, spec: str) -> Scale:
    """``scale`` with the create bursts of ``spec`` ("50" or "50x1,100x1": size x rounds),
    e.g. ``SANDLOT_BENCH_BURSTS=50 python -m bench create --quick`` for the 50-burst rows
    alone at quick scale. Empty: unchanged."""
    if not spec.strip():
        return scale
    bursts = []
    for part in spec.split(","):
        level, _, rounds = part.strip().partition("x")
        bursts.append((int(level), int(rounds or 1)))
    # Time for the bursts, their deletes and the same bursts of raw runc: a 100-burst at
    # quick scale was cut by the 120 s bound before its row was written.
    creates = sum(level * rounds for level, rounds in bursts)
    return replace(scale, create_concurrency=tuple(bursts),
                   bench_timeout=max(scale.bench_timeout, 60.0 + BURST_SECONDS * creates))


@dataclass
class BenchEnv:
    server: SandlotServer
    sandboxes: Sandboxes
    scale: Scale
    quick: bool
    image_cache: Path
    use_docker: bool
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sandlot-bench-w-",
                                                                        dir="/var/tmp")))
    notes: list[str] = field(default_factory=list)
    profiler: Profiler | None = None
    deadline: float = float("inf")  # time.monotonic() by which the current benchmark is cut
    _rootfs: Rootfs | None = None
    _runc: RuncBaseline | None = None
    _runc_error: str | None = None
    _runc_shared: RuncBaseline | None = None
    _docker: DockerBaseline | None = None
    _docker_error: str | None = None

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    async def quiesce(self, timeout: float = 15.0, idle_share: float = 0.8,
                      window: float = 0.25) -> float:
        """Wait until the machine is mostly idle; returns the seconds waited.

        A "warm sandbox" figure must not overlap the server's own background work (the warm
        pool refilling after a claim, teardowns of the previous benchmark's sandboxes), which
        on two cores would be measured as the command's latency.
        """
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            psutil.cpu_percent(interval=None)  # starts the window (machine-wide, all CPUs)
            await asyncio.sleep(window)
            if psutil.cpu_percent(interval=None) <= 100 * (1 - idle_share):
                break
        return time.monotonic() - t0

    def profile_execd(self, sandbox_id: str) -> None:
        """Under ``--profile``, sample the execd daemon of ``sandbox_id`` too."""
        if self.profiler is None:
            return
        for pid in sorted(execd_pids(self.server.container_ids([sandbox_id]))):
            self.profiler.attach(pid, f"execd-{pid}")

    def rootfs(self) -> Path:
        if self._rootfs is None:
            self._rootfs = Rootfs(self.image_cache, self.workdir)
        return self._rootfs.resolve()

    def runc(self) -> RuncBaseline | None:
        """The raw-runc baseline (None, with a note, when it cannot run here)."""
        if self._runc is not None or self._runc_error is not None:
            return self._runc
        if not RuncBaseline.available():
            self._runc_error = "runc not installed: raw runc baselines skipped"
        else:
            try:
                baseline = RuncBaseline(self.rootfs(), self.workdir / "runc",
                                        prefix=f"bench-{self.sandboxes.run_id}")
                baseline.prepare()
                self._runc = baseline
            except (RootfsUnavailable, OSError, RuntimeError) as exc:
                self._runc_error = f"raw runc baselines skipped: {exc}"
            except Exception as exc:  # noqa: BLE001 - e.g. CalledProcessError from runc spec
                self._runc_error = f"raw runc baselines skipped: {exc}"
        if self._runc_error:
            self.note(self._runc_error)
        return self._runc

    def runc_in_sandlot_parent(self) -> RuncBaseline | None:
        """Raw runc again, each container in sandlot's cgroup parent (``/sandlot/<id>``, a
        claimed sandbox's CPU shares): under a loaded host all sandboxes together get one
        parent's share of the CPU, which a default runc container (a cgroup of its own at the
        top) does not share. On a quiet host both baselines are the same."""
        if self._runc_shared is None and self.runc() is not None:
            baseline = RuncBaseline(self.rootfs(), self.workdir / "runc-sandlot-parent",
                                    prefix=f"bench-{self.sandboxes.run_id}-p",
                                    cgroup_parent=cgroups.PARENT)
            baseline.prepare()
            self._runc_shared = baseline
        return self._runc_shared

    def docker(self) -> DockerBaseline | None:
        """A private dockerd with the same rootfs imported (None, with a note, otherwise)."""
        if self._docker is not None or self._docker_error is not None:
            return self._docker
        why = DockerBaseline.available() if self.use_docker else (
            "docker baselines off (--quick without --docker, or --no-docker)")
        if why is None:
            baseline = DockerBaseline(self.workdir / "docker")
            try:
                rootfs = self.rootfs()
                baseline.start()
                baseline.import_rootfs(rootfs)
                self._docker = baseline
            except (DockerUnavailable, RootfsUnavailable, OSError, RuntimeError) as exc:
                baseline.close()
                why = f"docker baselines skipped: {exc}"
            except Exception as exc:  # noqa: BLE001 - httpx errors and the like
                baseline.close()
                why = f"docker baselines skipped: {exc}"
        if why is not None:
            self._docker_error = why
            self.note(why)
        return self._docker

    def close(self) -> None:
        if self._runc is not None:
            self._runc.close()
        if self._runc_shared is not None:
            self._runc_shared.close()
        if self._docker is not None:
            self._docker.close()
        if self._rootfs is not None:
            self._rootfs.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
