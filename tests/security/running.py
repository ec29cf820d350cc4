"""Start sandboxes over the raw lifecycle API and wait for them (the load and slow-client
tests need execd's direct endpoint, not an SDK object)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

EXECD_PORT = 44772


async def wait_running(c: httpx.AsyncClient, sandbox_id: str, polls: int = 600) -> None:
    """Poll every 0.1 s until Running; any state but Pending on the way fails the test."""
    for _ in range(polls):
        state = (await c.get(f"/v1/sandboxes/{sandbox_id}")).json()["status"]["state"]
        if state == "Running":
            return
        assert state == "Pending", state
        await asyncio.sleep(0.1)
    raise AssertionError(f"{sandbox_id} not Running after {polls / 10:.0f} s")


async def execd_endpoint(c: httpx.AsyncClient, sandbox_id: str) -> tuple[str, dict[str, str]]:
    """execd's direct endpoint of a Running sandbox: (host:port, headers)."""
    ep = (await c.get(f"/v1/sandboxes/{sandbox_id}/endpoints/{EXECD_PORT}")).json()
    return ep["endpoint"], ep.get("headers") or {}


async def running_sandbox(c: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str,
                                                                                dict[str, str]]:
    """Create one sandbox and wait for it: (id, execd host:port, execd headers)."""
    r = await c.post("/v1/sandboxes", json=body)
    assert r.status_code == 202, r.text
    sandbox_id = r.json()["id"]
    await wait_running(c, sandbox_id)
    endpoint, headers = await execd_endpoint(c, sandbox_id)
    return sandbox_id, endpoint, headers
