"""Client connections the host hands over whole, served as if execd had accepted them.

The server's endpoint listener accepts a client's TCP connection for execd's port and, on
runc sandboxes, passes the accepted socket here as a file descriptor (SCM_RIGHTS) on a
datagram socket bound in the abstract namespace of the sandbox's network namespace
(``protocol.HANDOFF_ADDRESS``). From then on the client talks to execd directly: no byte of
the connection passes through the server (a relayed request cost a wake-up of the server's
loop and two copies per chunk each way).

What this lets anything else do: a process in the sandbox can send to the same address, and
what it can send is a socket execd then serves HTTP on, which it could as well connect to
execd's port itself. Anything that is not a stream socket is closed unread. The received
descriptors are close-on-exec, so no command execd starts inherits a client's connection.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from sandlot.execd import protocol

log = logging.getLogger(__name__)

_BATCH = 64  # datagrams taken per wake-up before the loop runs anything else
_FDS_PER_DATAGRAM = 4  # the host sends one; a sender's extras are closed by the kernel
_INT = array.array("i")


def bind_receiver(address: bytes = protocol.HANDOFF_ADDRESS) -> socket.socket:
    """The bound, non-blocking datagram socket connections arrive on."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _receive(sock: socket.socket) -> list[int]:
    """The descriptors of one datagram, close-on-exec. Not ``socket.recv_fds``: Python
    3.11's ignores its flags, and without MSG_CMSG_CLOEXEC every command execd starts
    would inherit the connections received until then."""
    _, ancillary, _, _ = sock.recvmsg(16, socket.CMSG_LEN(_FDS_PER_DATAGRAM * _INT.itemsize),
                                      socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


class HandoffReceiver:
    """Takes the descriptors arriving on ``sock`` and gives each stream socket to ``adopt``."""

    def __init__(self, sock: socket.socket, adopt: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.adopt = adopt
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._drain)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _drain(self) -> None:
        for _ in range(_BATCH):
            try:
                fds = _receive(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("handed-over connection not received: %s", exc)
                return
            for fd in fds:
                self._take(fd)

    def _take(self, fd: int) -> None:
        try:
            sock = socket.socket(fileno=fd)  # learns family and type from the descriptor
        except OSError:  # not a socket at all
            os.close(fd)
            return
        if sock.type != socket.SOCK_STREAM:
            sock.close()
            return
        try:
            sock.setblocking(False)
            self.adopt(sock)
        except Exception:  # noqa: BLE001 - one bad connection must not stop the receiver
            log.exception("handed-over connection not served")
            with contextlib.suppress(OSError):
                sock.close()
