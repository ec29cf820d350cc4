"""execd's part in a gVisor hibernation: let go of its sockets, and listen again after.

On SIGUSR2 execd checks that the sandbox can be saved, closes its listeners, resets its
connections (SO_LINGER 0: a reset leaves no TIME_WAIT socket behind, which this runsc could
not save) and answers on stderr (the container log on the host) with a line
``sandlot-hibernation: ok`` or the reason it cannot; the host then checkpoints. On SIGUSR1
(after a restore, or after a refusal) it listens again on the same addresses.

What the Debian runsc build (2022) cannot save, checked here first because a failed
checkpoint ends the sandbox: TCP sockets in any state but LISTEN (e.g. TIME_WAIT for a minute
after a connection closed), and TCP sockets that a process watches with epoll. execd's own
sockets are not counted: it closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from sandlot.execd.httpserver import HttpServer

ANSWER_PREFIX = "sandlot-hibernation: "  # runtime/oci/hibernate.py reads it
CLOSE_GRACE = 0.5  # seconds for busy connections to finish before they are cut
_TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK",
    "0A": "LISTEN", "0B": "CLOSING",
}


def _tcp_sockets() -> dict[str, tuple[str, str]]:
    """inode -> (state name, local address) of every TCP socket in the sandbox."""
    found: dict[str, tuple[str, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) >= 10:
                    found[cols[9]] = (_TCP_STATES.get(cols[3].upper(), cols[3]), cols[1])
    return found


def _fd_links(pid: str) -> list[str]:
    fd_dir = Path("/proc", pid, "fd")
    links = []
    with contextlib.suppress(OSError):
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                links.append(os.readlink(fd))
    return links


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def _socket_inodes(links: list[str]) -> set[str]:
    return {link[8:-1] for link in links if link.startswith("socket:[")}


def blockers() -> list[str]:
    """Why the sandbox cannot be checkpointed now (empty: it can)."""
    tcp = _tcp_sockets()
    me = str(os.getpid())
    mine = _socket_inodes(_fd_links(me))  # execd closes its own sockets before the save
    reasons = []
    for inode, (state, local) in tcp.items():
        if inode not in mine and state not in ("LISTEN", "CLOSE"):
            reasons.append(f"a TCP socket on port {_port(local)} is in state {state}")
    for pid in (d.name for d in Path("/proc").iterdir() if d.name.isdigit() and d.name != me):
        links = _fd_links(pid)
        if not any("eventpoll" in link for link in links):
            continue
        ports = sorted({_port(tcp[inode][1]) for inode in _socket_inodes(links) if inode in tcp})
        if ports:
            with contextlib.suppress(OSError):
                comm = Path("/proc", pid, "comm").read_text().strip()
                reasons.append(f"process {pid} ({comm}) watches TCP sockets (ports "
                               f"{', '.join(map(str, ports))}) with epoll")
    return reasons


class Hibernation:
    """Installs the SIGUSR2/SIGUSR1 handlers on execd's loop (see module docstring)."""

    def __init__(
        self, server: HttpServer, addresses: list[str], make_socket: Callable[[str], socket.socket]
    ) -> None:
        self.server = server
        self.addresses = addresses
        self.make_socket = make_socket
        self.listening = True
        self._busy = asyncio.Lock()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGUSR2, lambda: loop.create_task(self.quiesce()))
        loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(self.relisten()))

    @staticmethod
    def _answer(text: str) -> None:
        sys.stderr.write(f"{ANSWER_PREFIX}{text}\n")
        sys.stderr.flush()

    async def quiesce(self) -> None:
        async with self._busy:
            reasons = await asyncio.to_thread(blockers)
            if reasons:
                self._answer("refused: " + "; ".join(reasons))
                return
            self.server.close_listeners()
            self.listening = False
            self.server.reset_connections()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CLOSE_GRACE
            while self.server.connections and loop.time() < deadline:
                await asyncio.sleep(0.01)
            self._answer("ok")

    async def relisten(self) -> None:
        async with self._busy:
            if self.listening:
                return
            await self.server.listen([self.make_socket(addr) for addr in self.addresses])
            self.listening = True
