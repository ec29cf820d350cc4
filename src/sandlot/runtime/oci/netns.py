"""Per-sandbox network namespaces and connecting into them from the host.

Namespaces are created with iproute2's ``ip netns`` (the well-kept tool that also pins them
under /run/netns, so they outlive a server restart). Connecting into a namespace uses
setns(2) on a worker thread: setns changes only the calling thread's namespace, and a
socket stays in the namespace it was created in, so the thread makes the socket, switches
back, and the event loop connects it.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
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


class NetnsConnector:
    """Makes TCP sockets inside a named network namespace."""

    def __init__(self) -> None:
        # One dedicated thread: it only ever leaves the host namespace between two setns calls.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandlot-netns")
        self._lock = threading.Lock()

    def _socket_in(self, ns: Path) -> socket.socket:
        with self._lock, open(f"/proc/self/task/{threading.get_native_id()}/ns/net") as home:
            with open(ns) as target:
                _setns(target.fileno())
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                # Failing to go home would leave this thread in the sandbox: never tolerated.
                try:
                    _setns(home.fileno())
                except OSError:
                    os.abort()

    async def connect(self, ns: Path, port: int) -> socket.socket:
        """A non-blocking TCP socket made in ``ns`` and connected to its ``127.0.0.1:port``."""
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._pool, self._socket_in, ns)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self._pool.shutdown(wait=False)
