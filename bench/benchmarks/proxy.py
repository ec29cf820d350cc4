"""6. Server-proxy overhead: the same sandbox reached directly and through ``use_server_proxy``.

One sandbox, two SDK handles (direct endpoint; ``/sandboxes/{id}/proxy/44772`` on the lifecycle
server). Requests alternate between them so drift hits both alike. The sandlot figure is the
proxied one; its baseline is the direct one, so the ratio is the proxy's cost.
"""

from __future__ import annotations

import contextlib
import time

from opensandbox import Sandbox
from opensandbox.models.execd import ExecutionHandlers, OutputMessage

from bench.baselines import host
from bench.env import BenchEnv
from bench.results import Measured, Row, ms

BENCH = "proxy"
KEYS = ("proxy.true_rtt", "proxy.first_byte", "proxy.download")


async def _first_byte(sandbox: Sandbox) -> float | None:
    seen: list[float] = []
    stamp: list[float] = []

    async def on_stdout(msg: OutputMessage) -> None:
        if not seen:
            seen.append(time.time())
            stamp.append(host.parse_stamp(msg.text) or -1.0)

    await sandbox.commands.run(host.FIRST_BYTE_SCRIPT,
                               handlers=ExecutionHandlers(on_stdout=on_stdout))
    return max(0.0, seen[0] - stamp[0]) if seen and stamp[0] > 0 else None


async def _download(sandbox: Sandbox, path: str) -> float:
    t0 = time.perf_counter()
    total = 0
    async for chunk in await sandbox.files.read_bytes_stream(path, chunk_size=1 << 20):
        total += len(chunk)
    return total / (time.perf_counter() - t0) / 1e6


async def run(env: BenchEnv) -> list[Row]:
    sc = env.scale
    direct, _ = await env.sandboxes.create()
    proxied: Sandbox | None = None
    rtt: dict[str, list[float]] = {"direct": [], "proxy": []}
    first: dict[str, list[float]] = {"direct": [], "proxy": []}
    down: dict[str, list[float]] = {"direct": [], "proxy": []}
    try:
        proxied = await env.sandboxes.connect(direct.id, proxy=True)
        handles = {"direct": direct, "proxy": proxied}
        for sb in handles.values():
            for _ in range(3):
                await sb.commands.run("true")
        for _ in range(sc.proxy_runs):
            for name, sb in handles.items():
                t0 = time.perf_counter()
                await sb.commands.run("true")
                rtt[name].append(time.perf_counter() - t0)
        for _ in range(sc.first_byte_runs):
            for name, sb in handles.items():
                value = await _first_byte(sb)
                if value is not None:
                    first[name].append(value)
        path = "/tmp/bench-proxy.bin"
        await direct.commands.run(f"head -c {sc.proxy_download_bytes} /dev/urandom > {path}")
        for _ in range(max(1, sc.stream_runs)):
            for name, sb in handles.items():
                down[name].append(await _download(sb, path))
    finally:
        if proxied is not None:
            with contextlib.suppress(Exception):
                await proxied.close()
        await env.sandboxes.delete(direct)

    size = f"{sc.proxy_download_bytes >> 20} MiB"
    return [
        Row(key="proxy.true_rtt", bench=BENCH, label='run("true") via server proxy',
            unit="ms", sandlot=Measured("proxy", ms(rtt["proxy"])),
            baselines=[Measured("direct", ms(rtt["direct"]))]),
        Row(key="proxy.first_byte", bench=BENCH, label="first stdout byte via server proxy",
            unit="ms", sandlot=Measured("proxy", ms(first["proxy"])) if first["proxy"] else None,
            baselines=[Measured("direct", ms(first["direct"]))] if first["direct"] else []),
        Row(key="proxy.download", bench=BENCH, label=f"download {size} via server proxy",
            unit="MB/s", sandlot=Measured("proxy", down["proxy"]),
            baselines=[Measured("direct", down["direct"])], higher_is_better=True),
    ]
