"""The bench's per-process CPU clock: another process's CPU time, all threads counted, at a
resolution finer than the 10 ms clock ticks ``psutil`` reports."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.procs import process_cpu_seconds

# Spins ~0.25 s of CPU on a worker thread, then waits to be killed (an exited thread's
# time must still count).
_BURN = """
import threading, time
def spin():
    t = time.thread_time()
    while time.thread_time() - t < 0.25:
        pass
w = threading.Thread(target=spin); w.start(); w.join()
print("done", flush=True)
time.sleep(60)
"""


def test_counts_another_processs_threads_at_sub_tick_resolution() -> None:
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"
        first = process_cpu_seconds(child.pid)
        time.sleep(0.05)
        second = process_cpu_seconds(child.pid)
        assert first is not None and second is not None
        assert 0.25 <= first < 2.0  # the exited worker's 0.25 s, plus the interpreter's start
        assert second >= first
        # Nanosecond clock: not a whole number of 10 ms ticks (odds of a false failure 1e-7).
        assert round(first * 1e9) % 10_000_000 != 0
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_has_no_clock() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_cpu_seconds(child.pid) is None
