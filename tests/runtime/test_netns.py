"""Network namespaces made in the server's process (oci/netns.py), not by running ``ip``."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import uuid

import pytest

from sandlot.errors import RuntimeFailure
from sandlot.runtime import tcp_connect
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


async def test_a_leftover_mount_point_file_is_replaced_by_the_namespace() -> None:
    """A machine that stops with namespaces pinned leaves their empty mount-point files where
    /run/netns is on disk (a reboot, a copied disk: CI once failed a create on one); nothing
    is mounted on them, so a create takes the name."""
    name = f"sltest-{uuid.uuid4().hex[:8]}"
    path = netns.netns_path(name)
    path.parent.mkdir(exist_ok=True)
    path.touch()
    try:
        assert not os.path.ismount(path)
        await netns.create_netns(name)
        assert os.path.ismount(path)
        links = _ip("-n", name, "-o", "link", "show")
        assert len(links.splitlines()) == 1 and links.startswith("1: lo: ")
        with pytest.raises(RuntimeFailure, match="exists"):  # now it is in use
            await netns.create_netns(name)
        assert os.path.ismount(path)
    finally:
        await netns.delete_netns(name)
    assert not path.exists()


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


def _sysctl_in(name: str, key: str, value: str | None = None) -> str:
    """Read (or set) net sysctl ``key`` inside namespace ``name``."""
    argv = ["ip", "netns", "exec", name, "sysctl", "-n", key]
    if value is not None:
        argv = ["ip", "netns", "exec", name, "sysctl", "-w", f"{key}={value}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


PORT = 44772  # execd's default port


async def test_a_reserved_port_is_never_a_connects_own_port() -> None:
    name = f"sltest-{uuid.uuid4().hex[:8]}"
    await netns.create_netns(name, reserved_ports=(PORT,))
    try:
        assert _sysctl_in(name, "net.ipv4.ip_local_reserved_ports") == str(PORT)
        # the only automatic port left would be the target's own: the connect cannot self-
        # connect, it finds no local port at all
        _sysctl_in(name, "net.ipv4.ip_local_port_range", f"{PORT} {PORT}")
        with pytest.raises(OSError) as caught:
            await netns.NetnsConnector().connect(netns.netns_path(name), PORT)
        assert caught.value.errno == errno.EADDRNOTAVAIL
    finally:
        await netns.delete_netns(name)


async def test_a_self_connection_is_refused_and_its_port_freed_at_once() -> None:
    name = f"sltest-{uuid.uuid4().hex[:8]}"
    path = await netns.create_netns(name)  # nothing reserved: the kernel's own behaviour
    try:
        assert _sysctl_in(name, "net.ipv4.ip_local_reserved_ports") == ""
        _sysctl_in(name, "net.ipv4.ip_local_port_range", f"{PORT} {PORT}")
        # the premise: a connect whose local port is the target's completes with itself
        raw = netns.socket_in(path)
        raw.connect(("127.0.0.1", PORT))
        assert raw.getsockname() == raw.getpeername() == ("127.0.0.1", PORT)
        assert tcp_connect.is_self_connected(raw)
        tcp_connect.close_with_reset(raw)
        # the connector reports it as nobody listening, and leaves the port free at once:
        # a server's bind (SO_REUSEADDR, as execd's) succeeds right after
        with pytest.raises(ConnectionRefusedError, match="itself"):
            await netns.NetnsConnector().connect(path, PORT)
        with netns.socket_in(path) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", PORT))
            server.listen()
            # and once something listens, the same connector connects to it
            _sysctl_in(name, "net.ipv4.ip_local_port_range", "32768 60999")
            conn = await netns.NetnsConnector().connect(path, PORT)
            assert conn.getpeername() == ("127.0.0.1", PORT) != conn.getsockname()
            conn.close()
    finally:
        await netns.delete_netns(name)


async def test_a_read_only_proc_sys_leaves_the_reservation_out_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A server whose ``/proc/sys`` is read-only still makes namespaces (the connector's
    self-connection check and execd's bind retry remain); it says so once."""
    monkeypatch.setattr(netns, "_RESERVED_PORTS", "/proc/sys/net/ipv4/sandlot-no-such-sysctl")
    monkeypatch.setattr(netns, "_reserve_warned", False)
    names = [f"sltest-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    try:
        with caplog.at_level("WARNING", logger=netns.__name__):
            for name in names:
                await netns.create_netns(name, reserved_ports=(PORT,))
        for name in names:
            assert os.path.ismount(netns.netns_path(name))
            assert _sysctl_in(name, "net.ipv4.ip_local_reserved_ports") == ""
        warnings = [r for r in caplog.records if "cannot reserve" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        for name in names:
            await netns.delete_netns(name)
