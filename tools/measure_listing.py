"""Where a 10,000-entry listing's time goes: execd, the server's endpoint relay, the client.

Starts a private ``sandlot serve`` (as ``bench``), creates one ``base`` sandbox, makes a
directory of N empty files in it (as ``bench files``), then alternates per round:

- ``httpx relay``: ``GET /directories/list`` through the sandbox's endpoint with httpx, body
  read and not parsed (what ``files.list_dir_http`` measures);
- ``raw relay``: the same request through the endpoint with a plain blocking socket that
  only reads the bytes (no client-side HTTP library cost);
- ``raw direct``: the same raw request on a socket made in the sandbox's network namespace,
  straight to execd (no relay);
- ``scandir+stat``: the bench's baseline, 10,000 host files.

For each it reports wall time (p50/p90) and, from ``/proc/<pid>/schedstat``, the time
execd, the server's main thread and this client spent on a CPU and waiting runnable for one
meanwhile. Run as root from the
repository root:

    PYTHONPATH=. .venv/bin/python tools/measure_listing.py --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlencode

import httpx
from bench.benchmarks.files import scandir_stat
from bench.procs import execd_pids
from bench.sdk import Sandboxes
from bench.server import SandlotServer
from bench.stats import percentile

from sandlot.execd.protocol import DEFAULT_PORT as EXECD_PORT
from sandlot.runtime.oci.netns import socket_in


def schedstat(pid: int | str) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting runnable for one) of a process's main thread
    (``/proc/<pid>/schedstat``, nanoseconds: finer than ``stat``'s clock ticks)."""
    run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run) / 1e9, int(wait) / 1e9


def raw_get(sock: socket.socket, request: bytes, buf: bytearray) -> int:
    """Send ``request``, read the whole response (Content-Length or chunked); body bytes
    on the wire."""
    sock.sendall(request)
    view = memoryview(buf)
    got = 0
    head_end = -1
    while head_end < 0:
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("closed in the head")
        got += n
        head_end = buf.find(b"\r\n\r\n", 0, got)
    head = bytes(buf[:head_end]).lower()
    body_start = head_end + 4
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name == b"content-length":
            length = int(value)
    total = got - body_start
    tail = bytes(buf[max(body_start, got - 5):got])
    while True:
        if length is not None and total >= length:
            return total
        if length is None and tail.endswith(b"0\r\n\r\n"):
            return total
        n = sock.recv_into(view)
        if not n:
            raise ConnectionError("closed in the body")
        total += n
        tail = (tail + bytes(view[:n]))[-5:]


async def profile(cmds: list[str], execd_pid: int, sock: socket.socket, request: bytes,
                  buf: bytearray, seconds: float = 8.0) -> None:
    """Run each profiler command (``{pid}`` replaced by execd's) while listings run back to
    back on the direct socket for ``seconds``."""
    for cmd in cmds:
        proc = await asyncio.create_subprocess_shell(cmd.format(pid=execd_pid))
        await asyncio.sleep(1.0)  # the profiler attaches
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            raw_get(sock, request, buf)
            n += 1
        await proc.wait()
        print(f"profiled {n} listings: {cmd}")


async def measure(rounds: int, entries: int, scratch: Path,
                  profile_cmds: list[str]) -> None:
    server = SandlotServer(warm_pool_size=0)
    server.start()
    sandboxes = Sandboxes(server, "measure-listing")
    host_dir = scratch / "dir"
    host_dir.mkdir()
    for i in range(1, entries + 1):
        (host_dir / str(i)).touch()
    try:
        sandbox, _ = await sandboxes.create()
        remote = "/tmp/bench-dir"
        made = await sandbox.commands.run(
            f"mkdir -p {remote} && cd {remote} && seq 1 {entries} | xargs touch")
        assert made.error is None, made.error
        endpoint = await sandbox.get_endpoint(EXECD_PORT)
        execd = sorted(execd_pids(server.container_ids([sandbox.id])))
        assert len(execd) == 1, execd
        execd_pid = execd[0]
        host, port = endpoint.endpoint.rsplit(":", 1)
        query = urlencode({"path": remote, "depth": "1"})
        head = "".join(f"{k}: {v}\r\n" for k, v in endpoint.headers.items())
        request = (f"GET /directories/list?{query} HTTP/1.1\r\nHost: {endpoint.endpoint}\r\n"
                   f"{head}\r\n").encode()
        buf = bytearray(4 << 20)

        relay_sock = socket.create_connection((host, int(port)))
        relay_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        direct_sock = socket_in(Path(f"/proc/{execd_pid}/ns/net"))
        direct_sock.connect(("127.0.0.1", EXECD_PORT))
        direct_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        size = raw_get(relay_sock, request, buf)
        raw_get(direct_sock, request, buf)

        wall: dict[str, list[float]] = defaultdict(list)
        cpu: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

        async with httpx.AsyncClient(headers=endpoint.headers, timeout=60.0) as client:
            url = f"http://{endpoint.endpoint}/directories/list"
            params = {"path": remote, "depth": "1"}
            await client.get(url, params=params)

            async def httpx_relay() -> None:
                r = await client.get(url, params=params)
                r.raise_for_status()

            async def raw_relay() -> None:
                raw_get(relay_sock, request, buf)

            async def raw_direct() -> None:
                raw_get(direct_sock, request, buf)

            async def baseline() -> None:
                scandir_stat(host_dir)

            variants = {"httpx relay": httpx_relay, "raw relay": raw_relay,
                        "raw direct": raw_direct, "scandir+stat": baseline}
            for _ in range(rounds):
                for name, fn in variants.items():
                    who = {"execd": execd_pid, "server": server.pid, "client": "thread-self"}
                    before = {k: schedstat(pid) for k, pid in who.items()}
                    t0 = time.perf_counter()
                    await fn()
                    wall[name].append(time.perf_counter() - t0)
                    for k, pid in who.items():
                        run, wait = schedstat(pid)
                        cpu[name][k].append(run - before[k][0])
                        cpu[name][k + " waiting"].append(wait - before[k][1])
                    # what execd's own running and waiting do not explain: the transfer
                    # after execd's last write, the client's reading, the request's way in
                    cpu[name]["not execd"].append(wall[name][-1] - cpu[name]["execd"][-1]
                                                  - cpu[name]["execd waiting"][-1])
                    await asyncio.sleep(0.05)
        if profile_cmds:
            await profile(profile_cmds, execd_pid, direct_sock, request, buf)
        relay_sock.close()
        direct_sock.close()
        print(f"body {size} bytes; load {os.getloadavg()}")
        base = statistics.median(wall["scandir+stat"])
        for name, values in wall.items():
            p50 = statistics.median(values)
            parts = ", ".join(f"{who} {1000 * statistics.median(v):.1f}"
                              for who, v in cpu[name].items())
            p90 = percentile(sorted(values), 90)
            print(f"{name:<14} p50 {1000 * p50:6.1f} ms  p90 {1000 * p90:6.1f}"
                  f"  ({p50 / base:4.2f}x)  ms p50: {parts}")
    finally:
        await sandboxes.shut_down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--profile", action="append", default=[],
                        help="a profiler command run against execd after the rounds while "
                             "listings run back to back (``{pid}``: execd's pid), e.g. "
                             "'py-spy record -p {pid} -d 9 -f raw -o out.txt'")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sandlot-listing-", dir="/var/tmp"))
    try:
        asyncio.run(measure(args.rounds, args.entries, scratch, args.profile))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
