"""A one-line picture of a kernel process that never became ready, for execd's log.

A warm kernel that does not answer its readiness requests is shut down and the context
starts another (a ~60 s wait for whoever asked). What the kernel was doing cannot be asked
afterwards, so it is read from ``/proc`` just before the shutdown: the process and thread
states with the kernel function each thread sleeps in, and the TCP sockets on the kernel's
ZMQ ports (who listens, who is connected to whom).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

# /proc/net/tcp's state column (include/net/tcp_states.h)
_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "06": "TIME_WAIT", "07": "CLOSE",
               "08": "CLOSE_WAIT", "0A": "LISTEN"}


def _read(path: str) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return f.read().strip()
    return "?"


def _threads(pid: int) -> list[str]:
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return []
    out = []
    for tid in tids:
        stat = _read(f"/proc/{pid}/task/{tid}/stat")
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        comm = _read(f"/proc/{pid}/task/{tid}/comm")
        out.append(f"{tid}:{comm}:{state}:{_read(f'/proc/{pid}/task/{tid}/wchan')}")
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _sockets(ports: Iterable[int], owned: set[str]) -> list[str]:
    """Lines of /proc/net/tcp{,6} with a local or remote port among ``ports``; the
    kernel's own sockets (inodes in ``owned``) are marked."""
    wanted = {f"{port:04X}" for port in ports if port}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        lines = _read(table).splitlines()[1:]
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote, state = fields[1], fields[2], fields[3]
            lport, rport = local.rsplit(":", 1)[-1], remote.rsplit(":", 1)[-1]
            if lport in wanted or rport in wanted:
                whose = " (kernel)" if fields[9] in owned else ""
                out.append(f"{int(lport, 16)}->{int(rport, 16)} "
                           f"{_TCP_STATES.get(state, state)}{whose}")
    return out


def describe(pid: int | None, ports: Iterable[int]) -> str:
    """``pid``'s state, its threads (tid:name:state:wchan) and the sockets on ``ports``."""
    if pid is None:
        return "no process"
    status = dict(line.split(":", 1) for line in _read(f"/proc/{pid}/status").splitlines()
                  if ":" in line)
    state = status.get("State", "gone").strip()
    return (f"pid {pid} {state}; threads {' '.join(_threads(pid)) or '-'}; "
            f"sockets {'; '.join(_sockets(ports, _socket_inodes(pid))) or '-'}")
