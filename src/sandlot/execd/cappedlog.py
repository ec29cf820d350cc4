"""A log file that never grows past a cap: at ``max_bytes`` it is rotated to ``<name>.1``
(the previous ``.1`` is dropped), so at most twice the cap is ever on disk.

The entrypoint's output goes through a pipe into one of these (not straight into the file):
a workload printing without end must not fill the host's disk through its sandbox's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

DEFAULT_MAX_BYTES = 8 << 20


class CappedLog:
    def __init__(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes) -> None:
        while data:
            room = self.max_bytes - self._size
            if room <= 0:
                self._rotate()
                continue
            chunk, data = data[:room], data[room:]
            os.write(self._fd, chunk)
            self._size += len(chunk)

    def _rotate(self) -> None:
        os.close(self._fd)
        os.replace(self.path, self.path + ".1")
        self._fd = self._open()
        self._size = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def copy_pipe_into(read_fd: int, log: CappedLog) -> asyncio.Future[None]:
    """Copy everything arriving on ``read_fd`` into ``log`` from the running loop, until EOF
    (the returned future's result)."""
    loop = asyncio.get_running_loop()
    eof: asyncio.Future[None] = loop.create_future()
    os.set_blocking(read_fd, False)

    def readable() -> None:
        try:
            data = os.read(read_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            with contextlib.suppress(OSError):  # a full disk must not stop execd
                log.write(data)
            return
        loop.remove_reader(read_fd)
        os.close(read_fd)
        log.close()
        if not eof.done():
            eof.set_result(None)

    loop.add_reader(read_fd, readable)
    return eof
