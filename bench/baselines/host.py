"""Plain ``subprocess`` on the host: the physical floor for running a command."""

from __future__ import annotations

import subprocess
import time

FIRST_BYTE_SCRIPT = "date +%s.%N; sleep 0.2"
TEXT = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"


def stream_command(size: int) -> str:
    """A shell command writing ``size`` bytes of text lines to stdout."""
    return f"yes {TEXT} | head -c {size}"


def parse_stamp(text: str) -> float | None:
    """The ``date +%s.%N`` timestamp at the start of ``text`` (None if the date lacks %N)."""
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def run_true(n: int) -> list[float]:
    """Seconds for ``subprocess.run(["true"])``, ``n`` times."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def first_byte(n: int, argv_prefix: list[str] | None = None) -> list[float]:
    """Seconds from the process writing a timestamp to the reader seeing it.

    The process prints ``date +%s.%N`` then stays alive, so this measures output delivery,
    not process exit. ``argv_prefix`` runs it through e.g. ``runc exec ID``.
    """
    out = []
    for _ in range(n):
        proc = subprocess.Popen([*(argv_prefix or []), "sh", "-c", FIRST_BYTE_SCRIPT],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        seen = time.time()
        proc.wait(timeout=30)
        stamp = parse_stamp(line.decode(errors="replace"))
        if stamp is not None:
            out.append(max(0.0, seen - stamp))
    return out


def stream_throughput(size: int, runs: int, argv_prefix: list[str] | None = None) -> list[float]:
    """MB/s of reading ``size`` bytes of text a command writes to stdout through a pipe."""
    out = []
    cmd = stream_command(size)
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen([*(argv_prefix or []), "sh", "-c", cmd], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        got = 0
        while chunk := proc.stdout.read(1 << 16):
            got += len(chunk)
        proc.wait(timeout=60)
        elapsed = time.perf_counter() - t0
        out.append(got / elapsed / 1e6)
    return out
