"""Which of the zygote's pages does a forked execd write, and what objects are on them?

Runs the zygote's preparation (``sandlot.execd.zygote.prepare``) in this process, forks an
execd (no sandbox: a unix socket under /tmp, a fixed token), sends it ``/ping`` (as the
server's readiness check does), waits, then compares the child's memory with ours page by
page (``/proc/<child>/mem``; this process stays idle meanwhile, so its pages are what the
child inherited). Each written page is attributed to the objects on it (every object
reachable from ``gc.get_objects()``), by type, and each written word to the object field it
lies in. Needs root (reading another process's memory). Usage:

    .venv/bin/python tools/profile_cow.py [--settle 3] [--top 25]
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def _anon_ranges(pid: int) -> list[tuple[int, int, str]]:
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        name = parts[5] if len(parts) > 5 else ""
        if "w" in parts[1] and (not name or name == "[heap]" or name.startswith("/")):
            out.append((lo, hi, name))
    return out


def _objects() -> tuple[list[int], list[int], list[str]]:
    """Start addresses, sizes and type names of every object reachable from the GC's."""
    seen: dict[int, object] = {}
    stack = list(gc.get_objects()) + list(gc.get_objects(generation=None) or [])
    for frozen in (gc.get_referents(*gc.get_objects()),):
        stack += frozen
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        try:
            stack += gc.get_referents(obj)
        except Exception:  # noqa: BLE001,S112 - some objects refuse
            continue
    rows = []
    code_files: dict[int, str] = {}
    for addr, obj in seen.items():
        if isinstance(obj, type(_objects.__code__)):
            code_files[addr] = obj.co_filename

        gc_head = 16 if gc.is_tracked(obj) else 0
        try:
            size = sys.getsizeof(obj)
        except Exception:  # noqa: BLE001
            size = 16
        rows.append((addr - gc_head, size + gc_head, type(obj).__name__ + ("" if not gc_head
                                                                            else "")))
    rows.sort()
    CODE_FILES.update(code_files)
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


CODE_FILES: dict[int, str] = {}  # code object address -> its file (where writes land)


def _trace_allocations(settle: float) -> None:
    """In the child: trace allocations; after ``settle`` s print the top sites (a thread)."""
    import threading
    import tracemalloc

    tracemalloc.start(12)

    def report() -> None:
        time.sleep(settle / 2)
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snap.statistics("traceback")
        print(f"child holds {sum(s.size for s in stats) / 1e6:.2f} MB in "
              f"{sum(s.count for s in stats)} blocks allocated since the fork", flush=True)
        for stat in stats[:15]:
            print(f"  {stat.size / 1e3:8.1f} kB {stat.count:6d} blocks", flush=True)
            for line in stat.traceback.format()[-12:]:
                print("     ", line.strip(), flush=True)

    threading.Thread(target=report, daemon=True).start()


def _short(path: str) -> str:
    for marker in ("site-packages/", "python3.11/", "src/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def signal_pause() -> None:
    import signal

    while True:
        signal.pause()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--seccomp", action="store_true",
                    help="the child also builds the default seccomp filter, as in a sandbox")
    ap.add_argument("--no-prebuilt", action="store_true",
                    help="with --seccomp: the child builds the filter (as before the cache)")
    ap.add_argument("--trim-thread", action="store_true", help="experiment: malloc_trim after 1 s")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="also print where the child allocated the memory it still holds")
    ap.add_argument("--code", action="store_true",
                    help="prepare as the zygote of code images (the code service imported)")
    a = ap.parse_args()
    from sandlot.execd import zygote

    profile_json = ""
    if a.seccomp:
        import json
        import subprocess

        profile_json = subprocess.run(  # not imported here: the zygote does not have it
            [sys.executable, "-c", "import json; from sandlot.runtime.oci.seccomp import "
             "seccomp_profile; print(json.dumps(seccomp_profile()))"],
            check=True, capture_output=True, text=True).stdout
    zygote.prepare(code=a.code)
    prebuilt = None
    if a.seccomp and not a.no_prebuilt:
        import json

        prebuilt = zygote.SeccompFilters().get(json.loads(profile_json))
    # A sibling that does nothing: its pages are what both children inherited (this process
    # allocates while it compares, so its own pages are not a stable reference).
    ref = os.fork()
    if ref == 0:
        signal_pause()
    # The socket and the child's temp dir (execd's state dir, which a killed execd leaves)
    # go in a folder of this tool's, removed at the end.
    work = tempfile.mkdtemp(prefix="profile-cow-")
    sock_path = os.path.join(work, "execd.sock")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.dup2(r, 0)
        tempfile.tempdir = work
        from sandlot.execd.main import main as execd_main

        if a.seccomp:  # the filter a forked execd builds from its plan (not loaded here)
            import json

            # as a forked execd does: the zygote's filter (or its own, with --no-prebuilt)
            plan = {"seccomp": json.loads(profile_json)}
            zygote.filter_for(plan, prebuilt).load()
        if a.tracemalloc:
            _trace_allocations(a.settle)
        if a.trim_thread:
            import ctypes
            import threading

            threading.Thread(target=lambda: (time.sleep(1.0), ctypes.CDLL(None).malloc_trim(0)),
                             daemon=True).start()

        os._exit(execd_main(["--listen", f"unix:{sock_path}", "--token-stdin"]) or 0)
    os.close(r)
    os.write(w, b"tok")
    os.close(w)
    for _ in range(500):
        if os.path.exists(sock_path):
            break
        time.sleep(0.01)
    time.sleep(0.2)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock_path)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(4096)
    time.sleep(a.settle)
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    private = sum(int(ln.split()[1]) for ln in rollup if ln.startswith("Private_"))
    print(f"child's USS (private pages, smaps_rollup): {private / 1e3:.2f} MB")
    starts, sizes, names = _objects()  # allocates: but only new memory, after the compare
    written_pages: Counter[str] = Counter()
    written_words: Counter[str] = Counter()
    by_region: Counter[str] = Counter()
    code_writes: Counter[str] = Counter()
    total = 0
    mem = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115
    own = open(f"/proc/{ref}/mem", "rb", buffering=0)  # noqa: SIM115
    try:
        for lo, hi, name in _anon_ranges(os.getpid()):
            for page in range(lo, hi, PAGE):
                try:
                    mem.seek(page)
                    theirs = mem.read(PAGE)
                    own.seek(page)
                    ours = own.read(PAGE)
                except OSError:
                    continue
                if theirs == ours:
                    continue
                total += 1
                by_region[name or "anonymous"] += 1
                kinds: set[str] = set()
                for off in range(0, PAGE, 8):
                    if theirs[off:off + 8] == ours[off:off + 8]:
                        continue
                    addr = page + off
                    i = bisect.bisect_right(starts, addr) - 1
                    if i >= 0 and addr < starts[i] + sizes[i]:
                        field = addr - starts[i]
                        kind = names[i] + (" refcnt" if field in (0, 16) else "")
                    else:
                        kind = "(no object: malloc/pymalloc metadata or free memory)"
                    if kind == "code":
                        code_writes[_short(CODE_FILES.get(starts[i], "?"))] += 1
                    written_words[kind] += 1
                    kinds.add(kind)
                for kind in kinds:
                    written_pages[kind] += 1
    finally:
        mem.close()
        own.close()
        for child in (pid, ref):
            os.kill(child, 9)
            os.waitpid(child, 0)
        shutil.rmtree(work, ignore_errors=True)
    print(f"pages written by the child: {total} ({total * PAGE / 1e6:.2f} MB)")
    for region, n in by_region.most_common():
        print(f"  {region:60s} {n * PAGE / 1e6:6.2f} MB")
    print("pages touched, by the kinds of words written on them (a page counts once per kind):")
    for kind, n in written_pages.most_common(a.top):
        print(f"  {kind:60s} {n:6d} pages  {written_words[kind]:7d} words")
    print("words written in code objects (warm-up counters, specialisation), by file:")
    for name, n in code_writes.most_common(a.top):
        print(f"  {name:60s} {n:7d} words")


if __name__ == "__main__":
    main()
