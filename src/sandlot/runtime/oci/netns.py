"""Per-sandbox network namespaces and connecting into them from the host.

Namespaces are pinned under /run/netns (as ``ip netns`` does, so they outlive a server
restart and ``ip netns`` sees them) by pyroute2's ``netns.attach``/``remove``. They are made
in the server's process, not by running ``ip`` twice per sandbox: a long-lived thread
unshares its network namespace, pins it, brings ``lo`` up and goes home (a burst of 50
cold creates spent ~40 ms per create, p90 ~200 ms, in the two ``ip`` runs on the loaded
2-core VM). pyroute2's own ``netns.create`` forks the server for this, which costs more than
``ip``. Connecting into a namespace uses
setns(2): it changes only the calling thread's namespace, and a socket stays in the namespace
it was created in, so the thread switches in, makes the socket, switches back, and the event
loop connects it.

A namespace can reserve ports (``ip_local_reserved_ports``, a per-namespace sysctl): no
automatic local port is ever taken from them, so polling a port before its server binds it
can never self-connect onto it and hold it (see ``tcp_connect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from pyroute2 import netns as pyroute2_netns

from sandlot.errors import RuntimeFailure
from sandlot.runtime import tcp_connect

log = logging.getLogger(__name__)
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_RESERVED_PORTS = "/proc/sys/net/ipv4/ip_local_reserved_ports"


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def _loopback_up() -> None:
    """``ip link set lo up`` in the calling thread's namespace: two ioctls (pyroute2's
    IPRoute costs ~4 ms of CPU to open, more than the whole namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


_reserve_warned = False  # a read-only /proc/sys is reported once per server


def _reserve_ports(ports: tuple[int, ...]) -> None:
    """Keep ``ports`` out of automatic local port choice in the calling thread's namespace
    (``/proc/sys/net`` shows the namespace of the thread that opens it).

    Best effort: where ``/proc/sys`` is read-only (a server in a container that is not
    privileged) the two other guards remain (``tcp_connect``'s refusal, execd's bind
    retry), so a create goes on, with one warning per server.
    """
    if not ports:
        return
    try:
        with open(_RESERVED_PORTS, "w", encoding="ascii") as f:
            f.write(",".join(str(p) for p in sorted(set(ports))))
    except OSError as exc:
        global _reserve_warned
        if not _reserve_warned:
            _reserve_warned = True
            log.warning("cannot reserve execd's port in sandbox network namespaces (%s): "
                        "polls before execd binds rely on the connector's self-connection "
                        "check and execd's bind retry alone", exc)


class _Stranded(Exception):
    """The maker thread could not go back to the server's namespace (it must end)."""


def _make_netns(name: str, reserved_ports: tuple[int, ...] = ()) -> None:
    """Unshare the calling thread's network namespace, pin it as ``name``, bring ``lo`` up,
    reserve ``reserved_ports`` and go home. Raises ``_Stranded`` when going home fails:
    that thread must then serve nothing else, since whatever it did next would happen
    inside the new namespace."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        try:
            _pin(name)
            try:
                _loopback_up()
                _reserve_ports(reserved_ports)
            except BaseException:
                pyroute2_netns.remove(name)
                raise
        finally:
            try:
                _setns(home)
            except OSError as exc:
                raise _Stranded(str(exc)) from exc
    finally:
        os.close(home)


Report = Callable[[BaseException | None], None]


class _NetnsMaker:
    """One long-lived thread that makes the namespaces, one after the other.

    A thread per namespace made the event loop wait for each thread's start-up
    (``Thread.start`` blocks until the new thread runs: p50 0.35 ms, p99 4.4 ms on the
    loaded 2-core VM, per cold create, on the loop); handing a job to a waiting thread is a
    queue put (~0.02 ms). A thread that could not go home ends, failing what is queued for
    it (a new one would inherit its namespace if it started it); the next job starts a
    fresh thread from the caller's.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, tuple[int, ...], Report]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, name: str, reserved_ports: tuple[int, ...], report: Report) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="netns-maker",
                                                daemon=True)
                self._thread.start()
            self._jobs.put((name, reserved_ports, report))

    def _serve(self) -> None:
        while True:
            name, reserved_ports, report = self._jobs.get()
            try:
                _make_netns(name, reserved_ports)
            except _Stranded as exc:
                with self._lock:
                    self._thread = None
                    report(OSError(f"cannot return from namespace {name}: {exc}"))
                    while True:
                        try:
                            _, _, queued = self._jobs.get_nowait()
                        except queue.Empty:
                            return
                        queued(OSError("the namespace maker thread ended"))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting create
                report(exc)
            else:
                report(None)


_MAKER = _NetnsMaker()


def _pin(name: str) -> None:
    """Bind the calling thread's namespace to /run/netns/``name``.

    Refused if a namespace is pinned there. A bare mount-point file with nothing mounted on
    it pins nothing: it is what a pinned namespace leaves when the machine stops without
    unmounting it and /run/netns is not a tmpfs (a reboot, a copied disk), so it is replaced.
    """
    try:
        _attach(name)
    except FileExistsError:
        if os.path.ismount(netns_path(name)):
            raise
        log.warning("replacing %s, a mount point with nothing mounted on it",
                    netns_path(name))
        with contextlib.suppress(FileNotFoundError):
            netns_path(name).unlink()
        _attach(name)


def _attach(name: str) -> None:
    try:
        pyroute2_netns.attach(name, threading.get_native_id())
    except FileExistsError:
        raise
    except BaseException:
        with contextlib.suppress(OSError):  # attach makes the mount point first
            if not os.path.ismount(netns_path(name)):
                netns_path(name).unlink()
        raise


async def create_netns(name: str, reserved_ports: tuple[int, ...] = ()) -> Path:
    """Create namespace ``name`` with only a loopback interface, up, and ``reserved_ports``
    kept out of automatic local port choice there (see the module docstring)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def report(exc: BaseException | None) -> None:
        loop.call_soon_threadsafe(_settle, done, exc)

    _MAKER.submit(name, reserved_ports, report)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        # The thread finishes anyway: remove what it made once it has.
        done.add_done_callback(lambda f: _remove_later(loop, name, f))
        raise
    except OSError as exc:  # nothing of it is left (see _make_netns)
        raise RuntimeFailure(f"cannot create network namespace {name}: {exc}") from exc
    return netns_path(name)


def _remove_later(loop: asyncio.AbstractEventLoop, name: str, made: asyncio.Future[None]) -> None:
    if made.exception() is not None:
        return  # nothing was made
    task = loop.create_task(delete_netns(name))
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)


_CLEANUPS: set[asyncio.Task[None]] = set()  # keeps the clean-up tasks referenced


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


async def delete_netns(name: str) -> None:
    """Remove namespace ``name``; a missing one is fine."""
    if not netns_path(name).exists():
        return
    try:
        await asyncio.to_thread(pyroute2_netns.remove, name)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RuntimeFailure(f"cannot delete network namespace {name}: {exc}") from exc


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def socket_in(ns: Path, family: int = socket.AF_INET,
              kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket (TCP unless told) created inside namespace ``ns`` (it stays there; this
    thread does not).

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
            return socket.socket(family, kind)
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
        (its loopback unless told otherwise); a self-connection is refused."""
        return await tcp_connect.connect(socket_in(ns), host, port)

    def close(self) -> None:
        """Nothing to release (kept so a runtime's close() need not know)."""
