"""Host tools run on a thread (vfork) instead of uvloop's fork of the whole server."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from sandlot.runtime.hosttools import run_tool


def _pids_with_marker(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def test_captures_output_and_exit_code() -> None:
    res = asyncio.run(run_tool(["sh", "-c", "echo out; echo err >&2; exit 3"]))
    assert (res.returncode, res.stdout, res.stderr, res.ok) == (3, b"out\n", b"err\n", False)


def test_missing_binary_is_exit_127_with_a_message() -> None:
    res = asyncio.run(run_tool(["/nonexistent/tool-" + uuid.uuid4().hex]))
    assert res.returncode == 127
    assert b"No such file" in res.stderr


def test_output_file_gets_both_streams(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "ab") as out:
        res = asyncio.run(run_tool(["sh", "-c", "echo one; echo two >&2"], output=out))
    assert res.ok
    assert sorted(log.read_text().split()) == ["one", "two"]


def test_timeout_kills_the_tool() -> None:
    t0 = time.monotonic()
    res = asyncio.run(run_tool(["sleep", "30"], timeout=0.3))
    assert res.returncode == -9 and b"timed out" in res.stderr
    assert time.monotonic() - t0 < 10


def test_cancelled_caller_leaves_no_tool_running() -> None:
    # The tool's own child (a sleep with a unique duration) must go too, not only the tool.
    marker = f"sandlot-hosttools-{uuid.uuid4().hex}"
    child = f"29.{uuid.uuid4().int % 10**9:09d}"

    async def go() -> None:
        script = f"sleep {child}; : {marker}"
        task = asyncio.create_task(run_tool(["sh", "-c", script]))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if _pids_with_marker(marker):
                break
        assert _pids_with_marker(marker), "the tool never started"
        task.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 10

    asyncio.run(go())
    assert _pids_with_marker(marker) == []
    assert _pids_with_marker(child) == []


def test_many_tools_at_once() -> None:
    async def go() -> list[bytes]:
        runs = [run_tool(["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(40)]
        return [r.stdout for r in await asyncio.gather(*runs)]

    t0 = time.monotonic()
    outs = asyncio.run(go())
    assert outs == [f"{i}\n".encode() for i in range(40)]
    assert time.monotonic() - t0 < 8  # in parallel, not one after another (40 x 0.2 s)
