"""Issue 11's load suite: 200 concurrent command streams over 20 sandboxes of a real
``sandlot serve`` for ``SANDLOT_LOAD_SECONDS`` (60 by default), with 0 errors (``slow``: it
does not pass yet, see README); and a client that drops its stream mid-way and resumes
(``Last-Event-ID``) loses 0 bytes (in the default run).

Streams go through the sandboxes' direct execd endpoints, as the SDKs' do.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from tests.compat.conftest import (  # noqa: F401
    SandlotServer,
    compat_backend,
    compat_image_root,
    fresh_server,
)
from tests.runtime.helpers import line_of, stream_event

SANDBOXES = 20
STREAMS = 200
SECONDS = float(os.environ.get("SANDLOT_LOAD_SECONDS", "60"))
LINES = 200  # each command prints 1..LINES
BODY = {"image": {"uri": "base"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 900,
        "resourceLimits": {"cpu": "250m", "memory": "256Mi"}}


async def _sandboxes(c: httpx.AsyncClient) -> list[tuple[str, dict[str, str]]]:
    ids = []
    for _ in range(SANDBOXES):
        r = await c.post("/v1/sandboxes", json=BODY)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    out = []
    for sid in ids:
        for _ in range(600):
            state = (await c.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"]
            if state == "Running":
                break
            assert state == "Pending", state
            await asyncio.sleep(0.1)
        ep = (await c.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()
        out.append((f"http://{ep['endpoint']}", ep.get("headers") or {}))
    return out


def _events(text: str) -> list[dict]:
    return [e for line in text.splitlines() if (e := stream_event(line)) is not None]


async def _stream_once(client: httpx.AsyncClient, base: str, headers: dict[str, str]) -> None:
    body = {"command": f"seq 1 {LINES}", "timeout": 60000}
    r = await client.post(f"{base}/command", json=body, headers=headers)
    assert r.status_code == 200, r.text
    events = _events(r.text)
    out = "".join(line_of(e) for e in events if e.get("type") == "stdout")
    assert out == "".join(f"{i}\n" for i in range(1, LINES + 1)), out[-200:]
    done = [e for e in events if e.get("type") == "execution_complete"]
    assert done and done[0].get("exit_code", 0) == 0, events[-3:]


async def _worker(client: httpx.AsyncClient, target: tuple[str, dict[str, str]],
                  until: float, counts: dict[str, int]) -> None:
    while time.monotonic() < until:
        try:
            await _stream_once(client, *target)
            counts["ok"] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
            counts["errors"] += 1
            counts.setdefault("first", repr(exc)[:500])  # type: ignore[arg-type]


async def _resume_after_drop(base: str, headers: dict[str, str]) -> None:
    """Read part of a stream, drop it, resume after the last event seen: nothing missing."""
    script = "for i in $(seq 1 60); do echo line-$i; sleep 0.05; done"
    async with httpx.AsyncClient(timeout=60) as client:
        seen: list[dict] = []
        last_id = None
        async with client.stream("POST", f"{base}/command?sse=1", headers=headers,
                                 json={"command": script, "timeout": 60000}) as r:
            async for line in r.aiter_lines():
                if line.startswith("id:"):
                    last_id = line[3:].strip()
                elif (event := stream_event(line)) is not None:
                    seen.append(event)
                if sum(1 for e in seen if e.get("type") == "stdout") >= 10:
                    break  # the client drops the connection here
        exec_id = next(e["text"] for e in seen if e.get("type") == "init")
        r = await client.get(f"{base}/command/{exec_id}/stream?sse=1",
                             headers={**headers, "Last-Event-ID": str(last_id)})
        assert r.status_code == 200, r.text
        rest = _events(r.text)
        out = "".join(line_of(e) for e in [*seen, *rest] if e.get("type") == "stdout")
        assert out == "".join(f"line-{i}\n" for i in range(1, 61)), out


@pytest.mark.slow  # ~0.2 % of streams end in ReadError on this loaded 2-core VM: see README
async def test_200_concurrent_streams_over_20_sandboxes(
    fresh_server: SandlotServer,  # noqa: F811
) -> None:
    srv = fresh_server
    limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=STREAMS)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits,
                                 headers={"OPEN-SANDBOX-API-KEY": srv.api_key}) as c:
        targets = await _sandboxes(c)
        counts: dict[str, int] = {"ok": 0, "errors": 0}
        until = time.monotonic() + SECONDS
        async with httpx.AsyncClient(timeout=120, limits=limits) as streams:
            await asyncio.gather(
                *(_worker(streams, targets[i % SANDBOXES], until, counts)
                  for i in range(STREAMS)),
                _resume_after_drop(*targets[0]),
            )
        print(f"load: {counts['ok']} streams of {LINES} lines in {SECONDS:.0f} s, "
              f"{counts['errors']} errors")
        assert counts["errors"] == 0, counts
        assert counts["ok"] >= STREAMS


async def test_a_dropped_stream_resumes_with_nothing_lost(
    fresh_server: SandlotServer,  # noqa: F811
) -> None:
    async with httpx.AsyncClient(base_url=fresh_server.url, timeout=120,
                                 headers={"OPEN-SANDBOX-API-KEY": fresh_server.api_key}) as c:
        r = await c.post("/v1/sandboxes", json=BODY)
        sid = r.json()["id"]
        for _ in range(600):
            if (await c.get(f"/v1/sandboxes/{sid}")).json()["status"]["state"] == "Running":
                break
            await asyncio.sleep(0.1)
        ep = (await c.get(f"/v1/sandboxes/{sid}/endpoints/44772")).json()
        await _resume_after_drop(f"http://{ep['endpoint']}", ep.get("headers") or {})
