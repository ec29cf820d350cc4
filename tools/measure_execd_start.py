"""CPU of one execd's start as the zygote forks it: from ``fork()`` to its first ``/ping``.

Runs the zygote's preparation (``sandlot.execd.zygote.prepare``) in this process, then
``--n`` times: forks an execd (no sandbox: a unix socket and its temp dir in a folder of this
tool's, removed at the end, since a killed execd leaves its state dir there; a fixed token),
connects as soon as it listens, sends ``/ping``, and reads the child's CPU from
``/proc/<pid>/schedstat`` (nanoseconds; ``/proc/<pid>/stat`` counts whole 10 ms ticks, which
lose most of a start) and its USS, then kills it. The fork's page-table copy is the
parent's, as it is the zygote's. No namespaces, cgroups or seccomp: what is left is
execd's own start and its copy-on-write faults, the part a change to execd or the zygote's
preload moves. ``--profile`` writes a cProfile of the last child's first second.

    .venv/bin/python tools/measure_execd_start.py --n 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def _cpu_ms(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def _uss_mb(pid: int) -> float:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return sum(int(ln.split()[1]) for ln in rollup if ln.startswith("Private_")) / 1e3


def _child(sock_path: str, temp_dir: str, token_fd: int, profile: str | None) -> None:
    os.dup2(token_fd, 0)
    tempfile.tempdir = temp_dir  # execd makes its state dir there, as in a sandbox's /tmp
    from sandlot.execd.main import main as execd_main

    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()

        def dump() -> None:
            time.sleep(1.0)
            prof.disable()
            with open(profile, "w") as out:
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)

        threading.Thread(target=dump, daemon=True).start()
    os._exit(execd_main(["--listen", f"unix:{sock_path}", "--token-stdin"]) or 0)


def _ping(sock_path: str) -> None:
    while True:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock_path)
            break
        except OSError:
            s.close()
            time.sleep(0.0005)
    with s:
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(4096)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="execds to start (the first 2 are "
                    "not counted: the parent's own first forks)")
    ap.add_argument("--profile", help="write a cProfile of the last child's start here")
    ap.add_argument("--code", action="store_true",
                    help="prepare as the zygote of code images (the code service imported)")
    a = ap.parse_args()
    from sandlot.execd import zygote

    zygote.prepare(code=a.code)
    cpus: list[float] = []
    usses: list[float] = []
    walls: list[float] = []
    work = Path(tempfile.mkdtemp(prefix="measure-execd-start-"))
    try:
        for i in range(a.n):
            sock_path = str(work / f"{i}.sock")
            r, w = os.pipe()
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _child(sock_path, str(work), r, a.profile if i == a.n - 1 else None)
            os.close(r)
            os.write(w, b"token")
            os.close(w)
            try:
                _ping(sock_path)
                walls.append((time.perf_counter() - t0) * 1e3)
                if a.profile and i == a.n - 1:
                    time.sleep(1.5)
                cpus.append(_cpu_ms(pid))
                usses.append(_uss_mb(pid))
            finally:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpus, usses, walls = cpus[2:], usses[2:], walls[2:]
    print(f"{len(cpus)} execds: CPU p50 {statistics.median(cpus):.2f} ms (min {min(cpus):.2f}, "
          f"max {max(cpus):.2f}); fork to /ping answered p50 {statistics.median(walls):.2f} "
          f"ms; USS p50 {statistics.median(usses):.2f} MB")


if __name__ == "__main__":
    main()
