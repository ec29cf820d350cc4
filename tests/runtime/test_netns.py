"""Network namespaces made in the server's process (oci/netns.py), not by running ``ip``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid

import pytest

from sandlot.errors import RuntimeFailure
from sandlot.runtime.oci import netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


async def test_a_namespace_has_loopback_up_and_the_server_stays_home() -> None:
    name = f"sltest-{uuid.uuid4().hex[:8]}"
    home = os.readlink("/proc/thread-self/ns/net")
    path = await netns.create_netns(name)
    try:
        assert path == netns.netns_path(name) and os.path.ismount(path)
        assert name in _ip("netns", "list")  # pinned where ip(8) looks
        links = _ip("-n", name, "-o", "link", "show")
        assert len(links.splitlines()) == 1 and links.startswith("1: lo: ")
        assert "UP" in links.split(">")[0].split(",")
        assert os.stat(path).st_ino != os.stat("/proc/thread-self/ns/net").st_ino
        assert os.readlink("/proc/thread-self/ns/net") == home
        # a name in use is refused, and the namespace that has it is left alone
        with pytest.raises(RuntimeFailure, match="exists"):
            await netns.create_netns(name)
        assert os.path.ismount(path)
    finally:
        await netns.delete_netns(name)
    assert not path.exists() and name not in _ip("netns", "list")
    await netns.delete_netns(name)  # a missing one is fine


async def test_many_at_once_all_made_and_removed() -> None:
    names = [f"sltest-{uuid.uuid4().hex[:8]}" for _ in range(12)]
    try:
        await asyncio.gather(*(netns.create_netns(n) for n in names))
        inodes = {os.stat(netns.netns_path(n)).st_ino for n in names}
        assert len(inodes) == len(names)  # twelve namespaces, not one twelve times
    finally:
        await asyncio.gather(*(netns.delete_netns(n) for n in names))
    assert not any(netns.netns_path(n).exists() for n in names)


def _maker_netns() -> list[str]:
    """The network namespace of the live namespace-maker thread, if there is one (Python
    gives threads no kernel name to look them up by)."""
    thread = netns._MAKER._thread
    if thread is None or not thread.is_alive() or thread.native_id is None:
        return []
    try:
        return [os.readlink(f"/proc/self/task/{thread.native_id}/ns/net")]
    except OSError:  # ended meanwhile
        return []


async def test_one_maker_thread_serves_every_create_and_stays_home() -> None:
    home = os.readlink("/proc/thread-self/ns/net")
    names = [f"sltest-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    try:
        await netns.create_netns(names[0])
        maker = netns._MAKER._thread
        for name in names[1:]:
            await netns.create_netns(name)
        assert netns._MAKER._thread is maker  # one thread for all of them
        assert _maker_netns() == [home]  # back home after each
    finally:
        await asyncio.gather(*(netns.delete_netns(n) for n in names))


async def test_a_maker_that_cannot_go_home_ends_and_the_next_create_gets_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = os.readlink("/proc/thread-self/ns/net")
    real_setns = netns._setns
    calls = 0

    def setns_failing_once(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(1, "setns refused (test)")
        real_setns(fd)

    stranded, after = f"sltest-{uuid.uuid4().hex[:8]}", f"sltest-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(netns, "_setns", setns_failing_once)
    try:
        with pytest.raises(RuntimeFailure, match="cannot return"):
            await netns.create_netns(stranded)
        for _ in range(100):  # the stranded thread ends instead of serving on
            if not _maker_netns():
                break
            await asyncio.sleep(0.01)
        assert _maker_netns() == []
        await netns.create_netns(after)
        assert _maker_netns() == [home]
        assert os.readlink("/proc/thread-self/ns/net") == home
    finally:
        await netns.delete_netns(stranded)
        await netns.delete_netns(after)
