"""execd's listening socket waits out a port that is taken for a moment (a host poll's
self-connection, a host-mode port caught in between) and gives up on a real conflict."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from sandlot.execd import main as execd_main
from tests.execd.conftest import free_port


def _hold(port: int) -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_port_taken_for_a_moment_is_bound_once_free() -> None:
    port = free_port()
    holder = _hold(port)
    timer = threading.Timer(0.3, holder.close)
    started = time.monotonic()
    timer.start()
    try:
        sock = execd_main.make_socket(f"tcp:127.0.0.1:{port}")
    finally:
        timer.join()
    try:
        assert time.monotonic() - started >= 0.25  # it waited for the holder to go
        assert sock.getsockname() == ("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens
    finally:
        sock.close()


def test_a_port_held_throughout_fails_after_the_bound_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(execd_main, "BIND_RETRY_SECONDS", 0.2)
    port = free_port()
    with _hold(port):
        before = _open_fds()
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            execd_main.make_socket(f"tcp:127.0.0.1:{port}")
        assert caught.value.errno == errno.EADDRINUSE
        assert 0.2 <= time.monotonic() - started < 5
        assert _open_fds() == before


def test_other_bind_errors_are_not_retried() -> None:
    started = time.monotonic()
    with pytest.raises(OSError) as caught:  # not an address of this host: nothing is sent
        execd_main.make_socket("tcp:198.51.100.254:44772")
    assert caught.value.errno == errno.EADDRNOTAVAIL
    assert time.monotonic() - started < execd_main.BIND_RETRY_SECONDS
