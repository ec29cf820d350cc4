"""Connecting the server's TCP sockets to ports in or beside a sandbox, self-connections refused.

A connect to a loopback port nobody listens on yet (execd's, while it starts) takes a random
local port from the ephemeral range; when that equals the target port, Linux completes a
simultaneous open with itself. That socket then holds the port, and execd's ``bind`` fails
with ``EADDRINUSE`` (measured: about 1 in 30,000 attempts; a start is polled from 5 ms
apart, backing off, until execd answers). A self-connected socket is closed with a reset,
which frees the port at once (a plain close would leave it in TIME_WAIT), and reported as
refused: to every caller it is the same as nobody listening yet.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def is_self_connected(sock: socket.socket) -> bool:
    """Whether ``sock`` is connected to its own address (a TCP simultaneous open)."""
    try:
        return bool(sock.getsockname() == sock.getpeername())
    except OSError:
        return False


def close_with_reset(sock: socket.socket) -> None:
    """Close ``sock`` so that its port is free at once (no TIME_WAIT)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    finally:
        sock.close()


async def connect(sock: socket.socket, host: str, port: int) -> socket.socket:
    """Connect ``sock`` (made non-blocking) to ``host:port``; on any failure it is closed.

    A self-connection raises ``ConnectionRefusedError``, as if nobody listened.
    """
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    if is_self_connected(sock):
        close_with_reset(sock)
        raise ConnectionRefusedError(
            errno.ECONNREFUSED, f"connecting to {host}:{port} reached the connecting socket "
            "itself (nothing listens there yet)")
    return sock
