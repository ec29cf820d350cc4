"""A stream reader slower than the command loses nothing: past the journal's backpressure
mark execd stops reading the command's pipes until the reader catches up, instead of letting
the journal's cap drop output the reader has not seen (the reference's execd blocks on its
client the same way). Without a reader the cap still bounds the journal (test_units)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from sandlot.execd.commands import _PipeWatch
from sandlot.execd.execution import Execution

LINES = 12_000
WIDTH = 250  # bytes per line: ~3 MiB of output against a 1 MiB journal cap

WRITER = (
    "import sys\n"
    f"for i in range({LINES}):\n"
    f"    sys.stdout.write(str(i).rjust({WIDTH - 1}, '.') + '\\n')\n"
)


async def _run(tmp_path: Path, reader_delay: float) -> tuple[list[str], Execution]:
    ex = Execution("bp", "writer", str(tmp_path), background=False, max_journal_bytes=1 << 20)
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, stdout=write_fd)
    os.close(write_fd)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()

    async def reap() -> None:
        exited.set_result(await proc.wait() << 8)  # a raw wait status, as waitpid gives

    reaper = asyncio.create_task(reap())
    _PipeWatch(ex, read_fd, None, exited, 0.2, lambda _ex: None)
    texts: list[str] = []
    async for frame in ex.journal.follow(0):
        for line in frame.decode().split("\n"):
            if line.strip():
                event = json.loads(line)
                if event["type"] == "stdout":
                    texts.append(event["text"])
        await asyncio.sleep(reader_delay)  # a slow client
    await reaper
    return texts, ex


async def test_a_slow_stream_reader_gets_every_line(tmp_path: Path) -> None:
    texts, ex = await _run(tmp_path, reader_delay=0.15)
    lines = [line for t in texts for line in t.splitlines()]  # an event per line, as sent
    numbers = [int(line.lstrip(".")) for line in lines]
    assert numbers == list(range(LINES))  # nothing dropped, nothing repeated, in order
    assert ex.journal.size > 2 * (1 << 20)  # the stream really outgrew the cap
    assert ex.exit_code == 0
    ex.discard()


async def test_a_reader_that_leaves_releases_the_command(tmp_path: Path) -> None:
    """A client that goes away must not leave the command blocked on a full pipe."""
    ex = Execution("gone", "writer", str(tmp_path), background=False, max_journal_bytes=1 << 20)
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, stdout=write_fd)
    os.close(write_fd)
    exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    _PipeWatch(ex, read_fd, None, exited, 0.2, lambda _ex: None)
    follower = ex.journal.follow(0)
    await follower.__anext__()  # connected, then stalls without reading on
    await asyncio.sleep(0.3)
    assert ex.journal.backlog() > 0
    await follower.aclose()  # the client disconnects
    exited.set_result(await asyncio.wait_for(proc.wait(), 30) << 8)
    await asyncio.wait_for(ex.done, 30)
    assert ex.exit_code == 0 and ex.log.lines == LINES
    ex.discard()
