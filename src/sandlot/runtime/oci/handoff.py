"""Handing an endpoint's client connection to execd whole, instead of relaying its bytes.

The other end is ``execd/handoff.py``: a datagram socket execd binds in the abstract
namespace of the sandbox's network namespace. The accepted socket travels as a descriptor
(SCM_RIGHTS); the server closes its own copy, so from then on only execd holds it.

Why it is safe: the descriptor is a TCP connection the client opened to the server's
loopback listener. Holding it lets execd read and write that one connection, which the relay
let it do byte by byte anyway; it cannot connect it elsewhere, and options that would reach
beyond it (marks, binding to a device) need capabilities in the host's network namespace,
which nothing in a sandbox has.
"""

from __future__ import annotations

import socket
from pathlib import Path

from sandlot.execd.protocol import HANDOFF_ADDRESS
from sandlot.runtime.oci.netns import socket_in


def hand_off(ns: Path, conn: socket.socket) -> None:
    """Send ``conn`` to the execd of network namespace ``ns``.

    Raises ``OSError`` when none takes it: ``ConnectionRefusedError`` when nothing is bound
    there (execd not up yet, or one from before hand-overs), ``BlockingIOError`` when its
    queue is full (a paused sandbox), ``FileNotFoundError`` when the namespace is gone.
    """
    with socket_in(ns, socket.AF_UNIX, socket.SOCK_DGRAM) as carrier:
        carrier.setblocking(False)
        # connect, then send: Python 3.11's send_fds ignores its address argument
        carrier.connect(HANDOFF_ADDRESS)
        socket.send_fds(carrier, [b"c"], [conn.fileno()])
