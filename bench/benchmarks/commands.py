"""2. Commands on a warm sandbox: ``run("true")`` round trip, first stdout byte, streaming.

First byte: the command prints ``date +%s.%N`` and stays alive; the figure is the wall-clock
gap between that timestamp and the SDK's ``on_stdout`` callback (same host clock), so it is
delivery latency, not process exit. Baselines: plain ``subprocess`` on the host, ``runc exec``
and ``docker exec`` on the same rootfs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from datetime import timedelta
from typing import Any

import stringzilla as sz
from opensandbox.models.execd import ExecutionHandlers, OutputMessage, RunCommandOpts

from bench.baselines import host
from bench.env import BenchEnv
from bench.results import Measured, Row, Target, ms, ratio_target
from sandlot.execd.protocol import DEFAULT_PORT as EXECD_PORT

BENCH = "commands"
KEYS = ("commands.true_rtt", "commands.first_byte", "commands.stream", "commands.stream_http")
STREAM_BUDGET = 60.0  # seconds; a stream cut by it still yields bytes received / time


# How each event that carries text (init, stdout) ends on the wire: its JSON's last field is
# the text, and every quote and newline inside a text is escaped, so this is found nowhere
# else. Counted instead of the bare blank line (``\n\n``, which ``count`` finds with a
# ``memchr`` from every line's newline), and with StringZilla's SIMD search (execd's own
# scans use it) rather than ``bytearray.count``: per MiB of 73-byte lines (1.7 MiB on the
# wire) 0.36 against 1.0 ms of the reader's CPU, which it would otherwise take from the two
# cores it shares with execd and the command (docs/benchmarks.md, 2026-12-04, 2026-12-06).
TEXT_EVENT_END = b'"}\n\n'


def _read_stream(address: str, headers: dict[str, str], body: bytes) -> tuple[float, int, bytes]:
    """(seconds, text events (init and output), last bytes) of one ``POST /command`` over a
    plain socket, read 64 KiB at a time until the server closes, as the baselines read their
    pipe. No HTTP client: httpx's chunked-body parse costs ~3-4 ms of CPU per MiB, as much
    as the whole server side, so it measured the reader (docs/benchmarks.md). Events never
    split across HTTP chunks (execd writes whole events), so each ends in one
    ``TEXT_EVENT_END``; the last bytes of the previous read catch one split between reads."""
    host, _, port = address.rpartition(":")
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /command HTTP/1.1\r\nHost: {address}\r\n{head}"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n").encode() + body
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    overlap = len(TEXT_EVENT_END) - 1
    events = 0
    carry = b""  # the previous read's last bytes: an event end split between two reads
    tail = b""
    with socket.create_connection((host.strip("[]"), int(port)), timeout=STREAM_BUDGET) as sock:
        t0 = time.perf_counter()
        sock.sendall(request)
        while n := sock.recv_into(buf):
            if carry:  # only an end that starts in ``carry`` and finishes in this read
                events += (carry + view[:min(n, overlap)].tobytes()).count(TEXT_EVENT_END)
            events += sz.Str(view[:n]).count(TEXT_EVENT_END)
            carry = (carry + view[max(0, n - overlap):n].tobytes())[-overlap:]
            tail = (tail + view[max(0, n - 256):n].tobytes())[-256:]
        elapsed = time.perf_counter() - t0
    return elapsed, events, tail


async def stream_raw(sandbox: Any, size: int) -> tuple[float, int]:
    """(seconds, stdout events) of ``POST /command`` for ``stream_command(size)`` read as raw
    bytes over the endpoint the SDK uses, in the framing the SDK receives (each event's JSON
    and a blank line): sandlot's share of a stream, without the SDK's per-event parse. The
    stream must end with ``execution_complete`` and the terminating chunk, so a short or
    broken stream cannot pass as a fast one."""
    endpoint = await sandbox.get_endpoint(EXECD_PORT)
    body = json.dumps({"command": host.stream_command(size),
                       "timeout": int(STREAM_BUDGET * 1000)}).encode()
    elapsed, text_events, tail = await asyncio.to_thread(
        _read_stream, endpoint.endpoint, dict(endpoint.headers or {}), body)
    if b'"execution_complete"' not in tail or not tail.endswith(b"0\r\n\r\n"):
        raise RuntimeError(f"raw stream did not end with execution_complete: {tail[-120:]!r}")
    return elapsed, text_events - 1  # the init event is not output


async def _streams_beside_runc(env: BenchEnv, sandbox: Any) -> tuple[list[float], list[float]]:
    """MB/s of the raw-HTTP stream (sandlot's side: execd, the endpoint path), each run
    followed by the same stream through ``runc exec``: the VM's speed drifts between minutes
    by more than the ratio's margin (``runc exec`` 388-521 MB/s in runs of one evening,
    docs/benchmarks.md), so the two are compared in the same minutes, as the bursts are."""
    sc = env.scale
    stream_http: list[float] = []
    runc_stream: list[float] = []
    lines = -(-sc.stream_bytes // (len(host.TEXT) + 1))
    runc = env.runc()
    cid = runc.run_detached()[0] if runc is not None else None
    try:
        for _ in range(sc.stream_runs):
            elapsed, events = await stream_raw(sandbox, sc.stream_bytes)
            if events != lines:  # execd's journal cap dropped what a lagging reader missed
                env.note(f"commands.stream_http: {events} of {lines} line events received "
                         "(the rest dropped past execd's journal cap while the reader lagged)")
            received = min(sc.stream_bytes, events * (len(host.TEXT) + 1))
            stream_http.append(received / elapsed / 1e6)
            if runc is not None and cid is not None:
                runc_stream += await asyncio.to_thread(
                    host.stream_throughput, sc.stream_bytes, 1, runc.exec_argv(cid))
    finally:
        if runc is not None and cid is not None:
            runc.delete(cid)
    return stream_http, runc_stream


async def run(env: BenchEnv) -> list[Row]:
    sc = env.scale
    sandbox, _ = await env.sandboxes.create()
    env.profile_execd(sandbox.id)
    try:
        for _ in range(5):  # warm-up: connections open, code paths hot
            await sandbox.commands.run("true")
        await env.quiesce()  # the pool refill after this sandbox's claim is not the command's

        rtt: list[float] = []
        for _ in range(sc.command_runs):
            t0 = time.perf_counter()
            execution = await sandbox.commands.run("true")
            rtt.append(time.perf_counter() - t0)
            if execution.error is not None:
                raise RuntimeError(f"`true` failed in the sandbox: {execution.error}")

        first: list[float] = []
        for _ in range(sc.first_byte_runs):
            seen: list[float] = []
            stamp: list[float] = []

            async def on_stdout(msg: OutputMessage, seen: list[float] = seen,
                                stamp: list[float] = stamp) -> None:
                if not seen:
                    seen.append(time.time())
                    stamp.append(host.parse_stamp(msg.text) or -1.0)

            await sandbox.commands.run(host.FIRST_BYTE_SCRIPT,
                                       handlers=ExecutionHandlers(on_stdout=on_stdout))
            if seen and stamp[0] > 0:
                first.append(max(0.0, seen[0] - stamp[0]))

        stream: list[float] = []
        stream_started = time.monotonic()
        for _ in range(sc.stream_runs):
            if stream and time.monotonic() - stream_started > STREAM_BUDGET / 2:
                break  # slow streams: one or two samples are enough, the time bound matters
            got = [0]

            async def count(msg: OutputMessage, got: list[int] = got) -> None:
                got[0] += len(msg.text) + 1  # one message per line, its newline stripped

            t0 = time.perf_counter()
            await sandbox.commands.run(
                host.stream_command(sc.sdk_stream_bytes),
                opts=RunCommandOpts(timeout=timedelta(seconds=STREAM_BUDGET)),
                handlers=ExecutionHandlers(on_stdout=count, skip_accumulation=True),
            )
            elapsed = time.perf_counter() - t0
            stream.append(got[0] / elapsed / 1e6)
            if got[0] < sc.sdk_stream_bytes * 0.99:
                env.note(f"commands.stream: received {got[0]} of {sc.sdk_stream_bytes} bytes "
                         f"in {elapsed:.1f}s (cut at {STREAM_BUDGET:.0f}s or truncated)")

        stream_http, runc_stream = await _streams_beside_runc(env, sandbox)
    finally:
        await env.sandboxes.delete(sandbox)

    base_rtt = [Measured("subprocess", ms(host.run_true(sc.command_runs)))]
    base_first = [Measured("subprocess", ms(host.first_byte(sc.first_byte_runs)))]
    base_stream = [Measured("subprocess",
                            host.stream_throughput(sc.stream_bytes, sc.stream_runs))]
    runc = env.runc()
    if runc is not None:
        cid, _ = runc.run_detached()
        try:
            base_rtt.append(Measured("runc exec", ms([runc.exec(cid, "true")
                                                      for _ in range(sc.command_runs)])))
            prefix = runc.exec_argv(cid)
            base_first.append(Measured("runc exec",
                                       ms(host.first_byte(sc.first_byte_runs, prefix))))
            base_stream.append(Measured("runc exec", runc_stream))
        finally:
            runc.delete(cid)
        shared = env.runc_in_sandlot_parent()
        if shared is not None:  # the same stream with a sandbox's share of the CPU
            cid, _ = shared.run_detached()
            try:
                base_stream.append(Measured("runc exec, sandlot's cgroup parent",
                                            host.stream_throughput(sc.stream_bytes,
                                                                   sc.stream_runs,
                                                                   shared.exec_argv(cid))))
            finally:
                shared.delete(cid)
    docker = env.docker()
    if docker is not None:
        cid, _ = docker.run_detached()
        try:
            base_rtt.append(Measured("docker exec", ms([docker.exec(cid, ["true"])[0]
                                                        for _ in range(sc.command_runs)])))
        finally:
            docker.remove(cid)

    size = f"{sc.stream_bytes >> 20} MiB"
    sdk_size = f"{sc.sdk_stream_bytes >> 20} MiB"
    return [
        Row(key="commands.true_rtt", bench=BENCH, label='commands.run("true") round trip',
            unit="ms", sandlot=Measured("sandlot", ms(rtt)),
            target=Target("<=", 5, "p50", "issue 3"), baselines=base_rtt),
        Row(key="commands.first_byte", bench=BENCH, label="first stdout byte after write",
            unit="ms", sandlot=Measured("sandlot", ms(first)) if first else None,
            target=Target("<=", 10, "p50", "issue 3"), baselines=base_first),
        Row(key="commands.stream", bench=BENCH, label=f"stdout streaming ({sdk_size})",
            unit="MB/s", sandlot=Measured("sandlot", stream), baselines=base_stream,
            higher_is_better=True,
            note=("through the released SDK: one parsed event per 73-byte line; baselines "
                  f"streamed {size}")),
        Row(key="commands.stream_http", bench=BENCH,
            label=f"stdout streaming ({size}), raw HTTP (socket reader, no SDK parse)", unit="MB/s",
            sandlot=Measured("sandlot", stream_http), baselines=base_stream,
            higher_is_better=True,
            target=ratio_target(">=", 0.6, next((b for b in base_stream
                                                 if b.name == "runc exec"), None), "issue 15")),
    ]
