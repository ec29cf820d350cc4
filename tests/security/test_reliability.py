"""Issue 11's reliability suites against a real ``sandlot serve`` (real runc sandboxes).

- create/delete cycles leak nothing: processes, mounts, cgroups, network namespaces, runc
  state, files, the server's file handles; the server's RSS grows <= 5 MB;
- chaos: ``kill -9`` of the server at random points of create, delete, pause and snapshot;
  after the restart every sandbox is Running and usable (a snapshot's source Running, not
  left frozen), or cleanly Failed or gone; nothing the runtime holds is without a record;
  every snapshot is Ready with its layer or Failed without one, and no layer or half copy
  lies on disk without a Ready record.

Sizes: ``SANDLOT_LEAK_CYCLES`` (40 by default, ~1 s each here; the 1000-cycle run, ~17 min,
is the ``slow`` variant) and ``SANDLOT_CHAOS_QUICK_RUNS`` (12, in ``make test``) /
``SANDLOT_CHAOS_RUNS`` (51, the ``slow`` variant; ~5-9 s each here).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import time
from pathlib import Path

import httpx
import pytest

from sandlot.runtime.oci import cgroups as cg
from sandlot.runtime.oci.layout import ROOTS_DIR, netns_name
from tests.compat.conftest import (  # noqa: F401
    SandlotServer,
    compat_backend,
    compat_image_root,
    fresh_server,
)

LEAK_CYCLES = int(os.environ.get("SANDLOT_LEAK_CYCLES", "40"))
CHAOS_RUNS = int(os.environ.get("SANDLOT_CHAOS_RUNS", "51"))
# make test's run of the same chaos (the 51-run one is ``slow``: 175-364 s on the 2-core VM).
CHAOS_QUICK_RUNS = int(os.environ.get("SANDLOT_CHAOS_QUICK_RUNS", "12"))
# The 1000-cycle run (``make test-heavy``): this many cycles at a time, and its time bound.
HEAVY_CYCLES = int(os.environ.get("SANDLOT_HEAVY_CYCLES", "1000"))
# One at a time by default: 4 at a time took 2.3x longer here (each create then misses the
# warm pool and pays a cold start on the 2 cores the refills also need).
LEAK_WORKERS = int(os.environ.get("SANDLOT_LEAK_WORKERS", "1"))
HEAVY_TIMEOUT = int(os.environ.get("SANDLOT_HEAVY_TIMEOUT", "3600"))
BODY = {"image": {"uri": "base"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600,
        "resourceLimits": {"cpu": "500m", "memory": "256Mi"}}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def traces(server: SandlotServer, sandbox_id: str) -> list[str]:
    """What is left on the host of one (deleted) sandbox."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        found += [f"mount {ln.split()[4]}" for ln in fh if sandbox_id in ln.split()[4]]
    found += [f"cgroup {d}" for d in cg.sandbox_cgroup_dirs(sandbox_id)]
    if Path("/run/netns", netns_name(sandbox_id)).exists():
        found.append("netns")
    for d in (server.data_dir / "sandboxes" / sandbox_id, server.data_dir / "runc" / sandbox_id):
        if d.exists():
            found.append(f"dir {d}")
    if any(d.name == sandbox_id for d in ROOTS_DIR.glob("*/*")):
        found.append("rootfs dir")
    return found


def wait_state(c: httpx.Client, sid: str, states: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        r = c.get(f"/v1/sandboxes/{sid}")
        if r.status_code == 404:
            return "gone"
        state = r.json()["status"]["state"]
        if state in states:
            return str(state)
        time.sleep(0.05)
    raise AssertionError(f"{sid} stuck in {state}")


def cycle(c: httpx.Client, server: SandlotServer | None = None) -> str:
    r = c.post("/v1/sandboxes", json=BODY)
    assert r.status_code == 202, r.text
    sid = str(r.json()["id"])
    state = wait_state(c, sid, {"Running", "Failed"})
    if state != "Running":  # the server's log goes with the test's data dir: keep its say
        said = [line for line in (server.log.read_text(errors="replace").splitlines()
                                  if server is not None and server.log.exists() else [])
                if sid in line or line.startswith((" ", "\t"))]
        raise AssertionError(f"{c.get(f'/v1/sandboxes/{sid}').json()['status']}\n"
                             + "\n".join(said[-60:]))
    assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    return sid


def sandbox_processes(ids: set[str], roots: tuple[str, ...]) -> list[str]:
    """Host processes that belong to one of ``ids``: in its cgroup, or rooted in its files."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroup = (proc / "cgroup").read_text()
            root = os.readlink(proc / "root")
        except OSError:
            continue  # exited meanwhile
        if any(sid in cgroup or sid in root for sid in ids) or root.startswith(roots):
            found.append(f"{proc.name}: {root} {cgroup.strip()}")
    return found


def children(pid: int) -> set[int]:
    """The processes ``pid`` started that still run (any of its threads may have)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(x) for x in (task / "children").read_text().split()}
        except OSError:
            continue  # the thread ended meanwhile
    return found


def run_cycles(server: SandlotServer, cycles: int, workers: int) -> list[str]:
    """``cycles`` create/delete cycles, ``workers`` at a time (each with its own client)."""
    def worker(n: int) -> list[str]:
        with server.client() as c:
            return [cycle(c, server) for _ in range(n)]

    shares = [cycles // workers + (1 if i < cycles % workers else 0) for i in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return [sid for ids in pool.map(worker, shares) for sid in ids]


def leak_check(server: SandlotServer, cycles: int, workers: int = 1) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    run_cycles(server, 10 * workers, workers)  # warm-up: pools, caches, lazily imported code
    time.sleep(2)
    fds_before = len(os.listdir(f"/proc/{pid}/fd"))
    kids_before = children(pid)
    rss_before = rss_kb(pid)
    started = time.monotonic()
    ids = run_cycles(server, cycles, workers)
    took = time.monotonic() - started
    time.sleep(2)
    left = {sid: t for sid in ids if (t := traces(server, sid))}
    assert not left, left
    roots = (str(server.data_dir / "sandboxes") + "/",)
    procs = sandbox_processes(set(ids), roots)
    assert not procs, procs
    with server.client() as c:
        assert c.get("/v1/sandboxes").json()["items"] == []
    new_kids = children(pid) - kids_before
    assert not new_kids, f"server children left running: {new_kids}"
    fds_after = len(os.listdir(f"/proc/{pid}/fd"))
    assert fds_after <= fds_before + 2, (fds_before, fds_after)
    growth_mb = (rss_kb(pid) - rss_before) / 1024
    print(f"leak check: {cycles} cycles ({workers} at a time) in {took:.0f} s, server fds "
          f"{fds_before}->{fds_after}, RSS {rss_before / 1024:.1f} MB +{growth_mb:.2f} MB")
    assert growth_mb <= 5, f"server RSS grew {growth_mb:.1f} MB over {cycles} cycles"


def test_create_delete_cycles_leak_nothing(fresh_server: SandlotServer) -> None:  # noqa: F811
    leak_check(fresh_server, LEAK_CYCLES)


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_1000_create_delete_cycles_leak_nothing(fresh_server: SandlotServer) -> None:  # noqa: F811
    leak_check(fresh_server, HEAVY_CYCLES, workers=LEAK_WORKERS)


CHAOS_OPS = ("create", "delete", "pause", "snapshot")


def _fire(server: SandlotServer, method: str, path: str, body: object = None) -> None:
    """Send a request and do not wait for it: the server is killed while it works on it."""
    import threading

    def send() -> None:
        try:
            with server.client() as c:
                c.request(method, path, json=body, timeout=10)
        except httpx.HTTPError:
            pass  # the server died under it: expected

    threading.Thread(target=send, daemon=True).start()


def _usable(c: httpx.Client, sid: str) -> bool:
    ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": "true"})
    if ep.status_code != 200:
        return False
    body = ep.json()
    r = c.get(f"http://{body['endpoint']}/ping", headers=body.get("headers") or {})
    return r.status_code == 200


def check_snapshots(server: SandlotServer, c: httpx.Client) -> None:
    """Every snapshot record is Ready with its layer, or Failed without one; no layer, and no
    half-copied one, without a Ready record. Then they are deleted (a clean slate)."""
    r = c.get("/v1/snapshots", params={"pageSize": 1000})
    assert r.status_code == 200, r.text
    records = {item["id"]: item["status"]["state"] for item in r.json()["items"]}
    layers = server.data_dir / "snapshots"
    on_disk = {d.name for d in layers.iterdir()} if layers.is_dir() else set()
    for snap, state in records.items():
        assert state in ("Ready", "Failed"), (snap, state)  # nothing stuck in Creating
        if state == "Ready":
            assert (layers / snap / "meta.json").is_file(), f"Ready {snap} has no layer"
        else:
            assert snap not in on_disk, f"Failed snapshot {snap} left its layer behind"
    orphans = {d for d in on_disk if records.get(d) != "Ready"}
    assert not orphans, f"snapshot layers or copies without a Ready record: {orphans}"
    for snap in records:
        assert c.delete(f"/v1/snapshots/{snap}").status_code == 204


def check_consistent(server: SandlotServer, running: str | None = None) -> None:
    """``running``: a sandbox nobody paused (a snapshot's source): it must be Running."""
    with server.client() as c:
        check_snapshots(server, c)
        items = c.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]  # the max
        known = set()
        for item in items:
            sid = item["id"]
            state = wait_state(c, sid, {"Running", "Failed", "Paused"})
            if state == "gone":
                continue
            known.add(sid)
            if sid == running:  # a snapshot's freeze must not outlive the server
                assert state == "Running", f"snapshot source {sid} is {state} after restart"
            if state == "Paused":
                assert c.post(f"/v1/sandboxes/{sid}/resume").status_code in (200, 202, 204)
                state = wait_state(c, sid, {"Running", "Failed"})
            if state == "Running":
                assert _usable(c, sid), f"{sid} is Running but execd does not answer"
        orphans = server.runtime_ids() - known
        assert not orphans, f"runtime holds sandboxes without a live record: {orphans}"
        for sid in known:  # a clean slate for the next run
            c.delete(f"/v1/sandboxes/{sid}")


def chaos(server: SandlotServer, runs: int, seed: int) -> None:
    rng = random.Random(seed)
    for run in range(runs):
        op = CHAOS_OPS[run % len(CHAOS_OPS)]
        source = None
        with server.client() as c:
            if op == "create":
                _fire(server, "POST", "/v1/sandboxes", BODY)
            else:
                r = c.post("/v1/sandboxes", json=BODY)
                sid = r.json()["id"]
                assert wait_state(c, sid, {"Running", "Failed"}) == "Running"
                if op == "snapshot":  # something of its own to copy
                    source = sid
                    write_files(c, sid)
                method, path = {
                    "delete": ("DELETE", f"/v1/sandboxes/{sid}"),
                    "pause": ("POST", f"/v1/sandboxes/{sid}/pause"),
                    "snapshot": ("POST", f"/v1/sandboxes/{sid}/snapshots"),
                }[op]
                _fire(server, method, path, {} if op == "snapshot" else None)
        time.sleep(rng.uniform(0, 0.3))
        server.kill9()
        server.start()
        check_consistent(server, running=source)


def write_files(c: httpx.Client, sid: str) -> None:
    """A few MB in the sandbox's writable layer, so a snapshot's copy takes a while."""
    ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": "true"})
    assert ep.status_code == 200, ep.text
    body = ep.json()
    r = c.post(f"http://{body['endpoint']}/command", headers=body.get("headers") or {},
               json={"command": "mkdir -p /data && for i in $(seq 40); do "
                                "head -c 262144 /dev/urandom > /data/f$i; done"},
               timeout=60)
    assert r.status_code == 200, r.text


def test_kill9_during_create_delete_pause_snapshot_leaves_a_consistent_state(
    fresh_server: SandlotServer,  # noqa: F811
) -> None:
    """The make-test size: every kind of operation is cut several times (~2 min here)."""
    chaos(fresh_server, CHAOS_QUICK_RUNS,
          seed=int(os.environ.get("SANDLOT_CHAOS_SEED", "11")))


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_kill9_fifty_times_leaves_a_consistent_state(
    fresh_server: SandlotServer,  # noqa: F811
) -> None:
    """The >= 50-run suite (``make test-heavy``, which CI runs after ``make test``)."""
    chaos(fresh_server, CHAOS_RUNS, seed=int(os.environ.get("SANDLOT_CHAOS_SEED", "29")))
