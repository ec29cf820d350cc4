"""Per-sandbox network namespaces and connecting into them from the host.

Namespaces are created with iproute2's ``ip netns`` (the well-kept tool that also pins them
under /run/netns, so they outlive a server restart). Connecting into a namespace uses
setns(2): it changes only the calling thread's namespace, and a socket stays in the namespace
it was created in, so the thread switches in, makes the socket, switches back, and the event
loop connects it.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
from pathlib import Path

from sandlot.errors import RuntimeFailure
from sandlot.runtime.hosttools import run_tool

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


async def _ip(*args: str) -> None:
    res = await run_tool(["ip", *args])
    if not res.ok:
        msg = res.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(f"ip {' '.join(args)} failed: {msg}")


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


async def create_netns(name: str) -> Path:
    """Create namespace ``name`` with only a loopback interface, up."""
    await _ip("netns", "add", name)
    try:
        await _ip("-n", name, "link", "set", "lo", "up")
    except BaseException:
        await delete_netns(name)
        raise
    return netns_path(name)


async def delete_netns(name: str) -> None:
    """Remove namespace ``name``; a missing one is fine."""
    if not netns_path(name).exists():
        return
    await _ip("netns", "delete", name)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def socket_in(ns: Path) -> socket.socket:
    """A TCP socket created inside namespace ``ns`` (it stays there; this thread does not).

    setns(2) switches only the calling thread, and only for the few calls below: no await,
    no callback and no other socket creation can run on this thread in between. Doing it
    inline costs two setns calls (microseconds); a worker-thread hop cost a thread wake-up
    per connection, milliseconds on a busy host.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            # Failing to go home would leave this thread in the sandbox: never tolerated.
            try:
                _setns(home)
            except OSError:
                os.abort()
    finally:
        os.close(home)


class NetnsConnector:
    """Connects TCP sockets to ports inside named network namespaces."""

    async def connect(self, ns: Path, port: int, host: str = "127.0.0.1") -> socket.socket:
        """A non-blocking TCP socket made in ``ns`` and connected to ``host:port`` there
        (its loopback unless told otherwise)."""
        sock = socket_in(ns)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """Nothing to release (kept so a runtime's close() need not know)."""
