"""How execd reads a fast command's pipe, and how much of a stream it keeps.

A hot read (the command writes faster than execd wakes up) pauses reading for a moment so
the next read gathers one large event batch; a read that took the whole pipe must not pause
(nothing more can gather, and the writer is blocked meanwhile). A foreground command's
journals keep a smaller window than a background command's (settings.py says why).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandlot.execd import commands
from sandlot.execd.commands import PIPE_SIZE, CommandService, _PipeWatch, make_pipe, pipe_size
from sandlot.execd.execution import Execution
from sandlot.execd.settings import Settings


async def _watch(tmp_path: Path, payload: bytes) -> Execution:
    """An execution fed from a pipe holding ``payload``, whose writer has closed and whose
    command has exited: only the pipe's reading stands between it and its end."""
    read_fd, write_fd = make_pipe()
    if pipe_size(read_fd) < PIPE_SIZE:
        os.close(read_fd)
        os.close(write_fd)
        pytest.skip("the kernel refused a pipe of PIPE_SIZE")
    assert len(payload) <= PIPE_SIZE
    assert os.write(write_fd, payload) == len(payload)
    os.close(write_fd)
    ex = Execution("batch", "writer", str(tmp_path), background=False)
    exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    exited.set_result(0)
    _PipeWatch(ex, read_fd, None, exited, 60.0, lambda _ex: None)  # no end but the pipe's
    return ex


async def test_a_read_that_took_the_whole_pipe_is_not_followed_by_a_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "BATCH_DELAY", 30.0)
    line = b"x" * 63 + b"\n"
    ex = await _watch(tmp_path, line * (PIPE_SIZE // len(line)))
    await asyncio.wait_for(ex.done, 5)  # with a pause after the full read: 30 s
    assert ex.log.size == PIPE_SIZE and ex.exit_code == 0
    ex.discard()


async def test_a_hot_read_short_of_the_pipe_still_pauses_to_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "BATCH_DELAY", 1.0)
    ex = await _watch(tmp_path, b"y" * 65535 + b"\n")
    await asyncio.sleep(0.3)
    assert not ex.done.done()  # paused: the end of the pipe is read after the delay
    await asyncio.wait_for(ex.done, 10)
    assert ex.log.size == 65536 and ex.exit_code == 0
    ex.discard()


async def test_foreground_journals_keep_a_smaller_window_than_background_ones(
    tmp_path: Path,
) -> None:
    window = 1 << 20
    service = CommandService(Settings(state_dir=str(tmp_path), max_journal_bytes=8 * window,
                                      max_foreground_journal_bytes=window))
    await service.startup()
    try:
        chunk = (b"z" * 127 + b"\n") * 1024  # 128 KiB
        for background in (False, True):
            ex = service.new_execution("printer", background=background)
            for _ in range(32):  # 4 MiB of output
                ex.feed("stdout", chunk)
            ex.finish(0)
            if background:  # all of it kept
                assert ex.log.floor == 0 and ex.journal.floor == 0
            else:  # the oldest dropped past the foreground window
                assert ex.log.floor > 0 and ex.journal.floor > 0
                assert ex.log.size - ex.log.floor <= window + len(chunk)
            assert ex.log.size == 32 * len(chunk)
    finally:
        await service.shutdown()
