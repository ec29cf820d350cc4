"""A bounded burst of concurrent creates and deletes leaves the server and host consistent."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

BURST = 5  # bounded: the machine is small and shared


async def test_concurrent_creates_and_deletes(sandlot_server: SandlotServer) -> None:
    cfg = ConnectionConfig(domain=sandlot_server.domain, api_key=sandlot_server.api_key)

    async def one(i: int) -> Sandbox:
        return await Sandbox.create(
            COMPAT_IMAGE,
            connection_config=cfg,
            metadata={"burst": "yes", "i": str(i)},
            ready_timeout=timedelta(seconds=120),
        )

    results = await asyncio.gather(*(one(i) for i in range(BURST)), return_exceptions=True)
    sandboxes = [s for s in results if isinstance(s, Sandbox)]
    try:
        assert len(sandboxes) == BURST, [r for r in results if not isinstance(r, Sandbox)]
        assert len({s.id for s in sandboxes}) == BURST
        with sandlot_server.client() as c:
            listed = c.get("/v1/sandboxes", params={"metadata": "burst=yes"}).json()
        assert listed["pagination"]["totalItems"] == BURST
        assert {i["status"]["state"] for i in listed["items"]} == {"Running"}
        assert {s.id for s in sandboxes} <= sandlot_server.runtime_ids()
    finally:
        await asyncio.gather(*(s.destroy() for s in sandboxes), return_exceptions=True)
    assert not ({s.id for s in sandboxes} & sandlot_server.runtime_ids())
    with sandlot_server.client() as c:
        assert c.get("/v1/sandboxes").json()["items"] == []
