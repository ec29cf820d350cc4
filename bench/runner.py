"""Runs the chosen benchmarks against a private server and always cleans up after them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench.benchmarks import BENCHMARKS, EXPECTED_KEYS, IMAGES
from bench.env import FULL, QUICK, BenchEnv, with_bursts
from bench.profiling import Profiler
from bench.report import print_table, write_chart
from bench.results import BenchOutcome, RunReport, now, result_stem, skipped, write_json
from bench.sdk import Sandboxes
from bench.server import (
    BUNDLE_CACHE,
    DEFAULT_IMAGE_CACHE,
    SandlotServer,
    data_dir_base,
    ensure_image,
    leftovers,
    reap_leftovers,
)
from sandlot import hostfs
from sandlot.runtime.execd_bundle import prune_shared

# Benchmarks that need longer than one bench's bound: density's many sandboxes, network's four
# servers of its own, kubernetes' image loading into the node and its two servers (cold, then
# warm Pods).
# A full run of every benchmark took ~25 minutes on the 2-core VM (2026-12-04, quiet: create
# 164 s, gvisor 285 s, docker 131 s, jupyter 115 s, the kubernetes kit's start and image
# loads ...); the budget leaves room for a slower or busier machine, so that a full run
# skips no benchmark. Each benchmark has its own bound besides (``bench_timeout``).
FULL_BUDGET = 2700.0
_SLOW = {"density": 2.5, "network": 2.0, "kubernetes": 6.0, "execd_launch": 3.0,
         "gvisor": 2.0, "create": 2.0}


@dataclass
class Options:
    names: list[str]
    quick: bool = False
    out_dir: Path = Path(__file__).resolve().parent / "results"
    image_cache: Path = DEFAULT_IMAGE_CACHE
    docker: bool | None = None  # None: on for full runs, off for --quick
    build_images: bool | None = None  # None: what the chosen benchmarks measure, unless quick
    profile: str | None = None
    profiler: str = "py-spy"
    budget: float | None = None  # seconds for all benchmarks (default FULL_BUDGET, 5 min --quick)


class SdkRetries(logging.Handler):
    """Counts the SDK's transport retries (each one adds its backoff to a figure) and keeps
    its log lines out of the table; the counts go into the report's notes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.retries: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("retrying "):
            parts = msg.split()
            path = parts[2].split("/", 3)[-1].rstrip(":") if len(parts) > 2 else "?"
            cause = next((p for p in parts if p.startswith("cause=")), "cause=?")
            key = f"/{path} {cause}"
            self.retries[key] = self.retries.get(key, 0) + 1

    def take(self) -> dict[str, int]:
        out, self.retries = self.retries, {}
        return out


def _quiet_sdk_logs() -> SdkRetries:
    handler = SdkRetries()
    sdk = logging.getLogger("opensandbox")
    sdk.handlers = [handler]
    sdk.propagate = False
    sdk.setLevel(logging.INFO)
    logging.getLogger("code_interpreter").setLevel(logging.ERROR)
    return handler


def _fill_missing(outcome: BenchOutcome) -> None:
    """Every expected row is in the report: measured, or marked skipped with the reason."""
    have = [r.key for r in outcome.rows]
    why = outcome.error or "not measured"
    for prefix in EXPECTED_KEYS[outcome.name]:
        if not any(k == prefix or k.startswith(prefix + ".") for k in have):
            outcome.rows.append(skipped(prefix, outcome.name, prefix.split(".", 1)[1],
                                        "", why))


async def _run_one(env: BenchEnv, name: str, opts: Options, report: RunReport,
                   console: Console, retries: SdkRetries, left: float) -> None:
    outcome = BenchOutcome(name)
    timeout = min(left, env.scale.bench_timeout * _SLOW.get(name, 1.0))
    if timeout < 10:
        outcome.error = "not run: the run's time budget was used up"
        _fill_missing(outcome)
        report.outcomes.append(outcome)
        console.print(f"[bold]{name}[/] [red]{outcome.error}[/]")
        return
    profiler = None
    if opts.profile == name:
        profiler = Profiler(opts.profiler, opts.out_dir, f"{result_stem(report.started)}-{name}")
        env.profiler = profiler
        profiler.attach(env.server.pid, "server")
        profiler.start_client()
    console.print(f"[bold]{name}[/] ...", end=" ")
    t0 = time.perf_counter()
    env.deadline = time.monotonic() + timeout
    try:
        outcome.rows = await asyncio.wait_for(BENCHMARKS[name](env), timeout)
    except TimeoutError:
        outcome.error = f"timed out after {timeout:.0f}s (bounded; sandboxes deleted)"
    except asyncio.CancelledError:
        outcome.error = "interrupted"
        raise
    except Exception as exc:  # noqa: BLE001 - one benchmark failing must not stop the rest
        outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        report.environment.setdefault("tracebacks", {})[name] = traceback.format_exc()[-3000:]
    finally:
        outcome.seconds = time.perf_counter() - t0
        with contextlib.suppress(Exception):
            await asyncio.wait_for(env.sandboxes.delete_all(), 120)
        if profiler is not None:
            for path in profiler.stop():
                report.notes.append(f"profile of {name}: {path}")
            report.notes += [f"profile of {name}: {e}" for e in profiler.errors]
            env.profiler = None
        _fill_missing(outcome)
        counted = retries.take()
        if counted:
            report.notes.append(f"{name}: the SDK retried requests (each retry adds its "
                                f"backoff, 0.5 s at first, to the figure): {counted}")
        report.outcomes.append(outcome)
        status = f"[red]{outcome.error}[/]" if outcome.error else "[green]done[/]"
        console.print(f"{status} ({outcome.seconds:.1f}s)")


async def _run_all(env: BenchEnv, opts: Options, report: RunReport, console: Console) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    retries = _quiet_sdk_logs()
    budget = opts.budget or (300.0 if opts.quick else FULL_BUDGET)
    deadline = time.monotonic() + budget
    try:
        for name in opts.names:
            await _run_one(env, name, opts, report, console, retries,
                           deadline - time.monotonic())
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await env.sandboxes.aclose()


def _describe_host(opts: Options) -> dict[str, object]:
    """What the figures were measured on (cores, memory, versions, commit)."""
    import importlib.metadata as md
    import os
    import subprocess

    import psutil

    def first_line(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unavailable"

    versions = {}
    for pkg in ("sandlot", "opensandbox", "opensandbox-code-interpreter"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
        "load_average_at_start": os.getloadavg(), "versions": versions,
        "runc": first_line(["runc", "--version"]), "dockerd": first_line(["dockerd", "--version"]),
        "commit": first_line(["git", "-C", str(Path(__file__).resolve().parent.parent),
                              "rev-parse", "--short", "HEAD"]),
        "image_cache": str(opts.image_cache),
        "runtime_toml": os.environ.get("SANDLOT_BENCH_RUNTIME_TOML", ""),
        "bursts": os.environ.get("SANDLOT_BENCH_BURSTS", ""),
        "servers_data_dirs": _data_dir_fs(),
    }


def _data_dir_fs() -> str:
    """Where the bench servers' data dirs go and whether that is journal-less ext4, which
    slows creates after deletes (``sandlot.hostfs``): the create rows depend on it."""
    base = Path(data_dir_base() or tempfile.gettempdir())
    device = hostfs.ext4_without_journal(base)
    return f"{base}: ext4 without a journal (/dev/{device})" if device else f"{base}"


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def images_to_build(opts: Options) -> list[str]:
    """Images the chosen benchmarks measure, to build if missing (``image build --if-missing``).

    By default a full run builds them (a newcomer's first ``make bench`` skips no row) and a
    ``--quick`` run does not (the smoke test must stay quick; its code rows say what is
    missing); ``--build-images`` / ``--no-build-images`` decide explicitly.
    """
    build = opts.build_images if opts.build_images is not None else not opts.quick
    if not build:
        return []
    return sorted({image for name in opts.names for image in IMAGES.get(name, ())})


def _prune_bundle_cache(report: RunReport) -> list[str]:
    """The execd bundles of earlier code versions removed from the bench's shared cache
    (``prune_shared``: not served for a day, unused on the host)."""
    try:
        return [p.name for p in prune_shared(BUNDLE_CACHE)]
    except Exception as exc:  # noqa: BLE001 - a cache left as it was does not stop the run
        report.notes.append(f"the bundle cache was not pruned: {exc}")
        return []


def run(opts: Options) -> tuple[RunReport, int]:
    console = Console(width=200)
    scale = with_bursts(QUICK if opts.quick else FULL, os.environ.get("SANDLOT_BENCH_BURSTS", ""))
    report = RunReport(started=now(), quick=opts.quick)
    report.environment.update(_describe_host(opts))
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    server = SandlotServer(image_cache=opts.image_cache)
    env: BenchEnv | None = None
    interrupted = False
    try:
        t0 = time.perf_counter()
        ok, msg = ensure_image("base", opts.image_cache)
        report.environment["base_image"] = {"ok": ok, "seconds": round(time.perf_counter() - t0, 1),
                                            "output": msg}
        if not ok:
            report.notes.append(f"`sandlot image build base` failed: {msg}")
        report.environment["bundle_cache_pruned"] = _prune_bundle_cache(report)
        for image in images_to_build(opts):
            t0 = time.perf_counter()
            ok_img, msg_img = ensure_image(image, opts.image_cache, timeout=1800)
            report.environment[f"{image}_image"] = {
                "ok": ok_img, "seconds": round(time.perf_counter() - t0, 1), "output": msg_img}
            if not ok_img:
                report.notes.append(f"`sandlot image build {image}` failed: {msg_img}")
        server.start()
        console.print(f"sandlot server on {server.base_url} (pid {server.pid}, "
                      f"data dir {server.data_dir})")
        env = BenchEnv(
            server=server, sandboxes=Sandboxes(server, secrets.token_hex(4)), scale=scale,
            quick=opts.quick, image_cache=opts.image_cache,
            use_docker=opts.docker if opts.docker is not None else not opts.quick,
        )
        asyncio.run(_run_all(env, opts, report, console))
    except (KeyboardInterrupt, asyncio.CancelledError):  # SIGINT / SIGTERM
        interrupted = True
        report.notes.append("interrupted: the run was stopped; everything it made was removed")
    except Exception as exc:  # noqa: BLE001 - report what happened, after cleaning up
        report.notes.append(f"run failed: {type(exc).__name__}: {exc}")
        report.environment["server_log_tail"] = server.log_tail(40)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up, then exit
        _cleanup(server, env, report)
        signal.signal(signal.SIGTERM, previous)
    report.notes += [] if env is None else env.notes
    json_path = write_json(report, opts.out_dir)
    chart = write_chart(report, opts.out_dir)
    print_table(report, console)
    console.print(f"results: {json_path}" + (f", chart: {chart}" if chart else ""))
    failed = interrupted or any(o.error for o in report.outcomes) or not report.outcomes
    return report, 1 if failed else 0


def _cleanup(server: SandlotServer, env: BenchEnv | None, report: RunReport) -> None:
    if server.proc is not None and server.proc.poll() is None and env is not None:
        try:
            swept = env.sandboxes.sweep()
            if swept:
                report.notes.append(f"last sweep deleted {len(swept)} sandbox(es) left behind")
        except Exception as exc:  # noqa: BLE001 - keep cleaning up
            report.notes.append(f"last sweep failed: {exc}")
    if env is not None:
        env.close()
    if any(o.error for o in report.outcomes):
        report.environment.setdefault("server_log_tail", server.log_tail(40))
    root = server.root
    server.stop()
    if root is not None:
        left = reap_leftovers(root) + leftovers(root)
        if left:
            report.notes.append(f"left on the host after the server stopped (the harness "
                                f"removed them): {len(left)} item(s), e.g. {left[:4]}")
            report.environment["leftovers"] = left
            report.environment.setdefault("server_log_tail", server.log_tail(40))
    server.remove()
