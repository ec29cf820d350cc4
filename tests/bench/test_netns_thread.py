"""``bench/netns_thread.py``: a benchmark's client in a namespace, the run's threads not.

The network benchmark used to move the run's event loop thread into its lab namespace and
back; default-executor workers spawned meanwhile stayed in the lab, and a later benchmark's
server started from one listened where nothing reached it (CI, 2026-12-04)."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest
from bench.netns_thread import run_in_netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (ip netns)")


def _netns_inode() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


@pytest.fixture
def netns() -> Iterator[str]:
    name = "slbt" + secrets.token_hex(3)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_the_body_and_its_threads_run_in_the_namespace_the_callers_do_not(netns: str) -> None:
    host = _netns_inode()
    target = os.stat(f"/run/netns/{netns}").st_ino

    async def body() -> list[int]:
        await asyncio.sleep(0.2)  # the caller's loop runs its own work meanwhile
        inside = await asyncio.gather(*(asyncio.to_thread(_netns_inode) for _ in range(8)))
        return [_netns_inode(), *inside]

    async def main() -> tuple[list[int], list[int], list[int]]:
        during = asyncio.gather(*(asyncio.to_thread(_slow_inode) for _ in range(8)))
        inside = await run_in_netns(netns, body)
        after = await asyncio.gather(*(asyncio.to_thread(_netns_inode) for _ in range(32)))
        return inside, list(await during), list(after)

    inside, during, after = asyncio.run(main())
    assert set(inside) == {target}
    assert set(during) == {host}, "the caller's workers started during the body moved"
    assert set(after) == {host}, "a worker of the caller's loop is left in the namespace"
    assert _netns_inode() == host


def _slow_inode() -> int:
    threading.Event().wait(0.3)
    return _netns_inode()


def test_an_error_in_the_body_reaches_the_caller(netns: str) -> None:
    async def body() -> None:
        raise ValueError("from the lab")

    with pytest.raises(ValueError, match="from the lab"):
        asyncio.run(run_in_netns(netns, body))


def test_cancelling_the_caller_cancels_the_body_and_waits_for_its_clean_up(
        netns: str, caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []

    async def body() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.2)  # a clean-up that takes a while
            events.append("cleaned up")

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run_in_netns(netns, body), 0.5)
        events.append("caller resumed")

    asyncio.run(main())
    assert events == ["cleaned up", "caller resumed"]
    gc.collect()  # an outcome nobody retrieved is logged when its future is collected
    assert "never retrieved" not in caplog.text
