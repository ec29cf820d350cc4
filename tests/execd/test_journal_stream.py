"""The events journal's stream path: it stores the reference's framing, a caught-up follower
gets an append's bytes without a read-back, resume skips the blank line after an event, and
dropped segments' files are reused for new ones without their old bytes showing, and a small
journal stays in memory until it grows."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from sandlot.execd import sse
from sandlot.execd.execution import Execution
from sandlot.execd.journal import EventJournal
from sandlot.execd.segments import SegmentedFile


async def test_live_follower_and_file_agree(tmp_path: Path) -> None:
    j = EventJournal(str(tmp_path / "j"))
    j.append(sse.init_event("x"))
    got: list[bytes] = []

    async def read() -> None:
        async for chunk in j.follow(0):
            got.append(chunk)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.02)  # the follower has sent the init event and waits
    block = sse.encode_region("stdout", b"one\n\ntwo\n", frames=True)
    j.append_frames(block)
    await asyncio.sleep(0.02)
    assert got[-1] is block  # handed over as written, not read back from the file
    j.append(sse.complete_event(1))
    j.close()
    await reader
    on_disk = (tmp_path / "j").read_bytes()
    assert b"".join(got) == on_disk  # the journal holds the wire framing
    texts = [json.loads(f).get("text") for f in on_disk.split(b"\n\n")[:-1]]
    assert texts == ["x", "one", "\n", "two", None]


async def test_resume_skips_the_seen_event_and_its_blank_line(tmp_path: Path) -> None:
    j = EventJournal(str(tmp_path / "j"))
    ids = [j.append(sse.stdout_event(f"e{i}")) for i in range(3)]
    j.close()
    assert j.resume_offset(str(ids[0])) == ids[1]
    assert j.resume_offset(str(ids[1] - 1)) == ids[1]  # an id on a blank line: the next event
    assert j.resume_offset(str(ids[1] - 2)) == ids[1]  # on the newline ending an event
    frames = b"".join([c async for c in j.follow(j.resume_offset(str(ids[1])),
                                                  sse_frames=True)])
    assert frames == b"id: %d\ndata: %s\n\n" % (ids[2], (tmp_path / "j").read_bytes()[ids[2]:-2])


async def test_a_partial_frame_read_is_held_until_its_blank_line(tmp_path: Path) -> None:
    """A follower reading behind the writer (no hand-over) may read up to the middle of a
    frame's blank line; it must send whole frames only."""
    j = EventJournal(str(tmp_path / "j"))
    for i in range(2000):
        j.append(sse.stdout_event("x" * (400 + i % 397)))
    j.close()
    expected = (tmp_path / "j").read_bytes()
    chunks = [c async for c in j.follow(0)]
    assert b"".join(chunks) == expected
    assert len(chunks) >= 2 and all(c.endswith(b"}\n\n") for c in chunks)


def test_dropped_segments_are_reused_without_their_old_bytes(tmp_path: Path) -> None:
    f = SegmentedFile(str(tmp_path / "s"), 100)
    reader = f.reader()
    for i in range(10):
        f.append(bytes([65 + i]) * 60)  # two appends per segment
    assert len(f.segments) == 2
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2  # the rest were renamed into new segments, not left behind
    # Every kept byte reads back as written, through a reader that held an older file.
    for i in range(10):
        pos = i * 60
        if pos >= f.floor:
            assert reader.pread(60, pos) == bytes([65 + i]) * 60
    f.append(b"z" * 5)  # a short last segment in a reused, longer file
    f.close()
    last_base, last_path = f.segments[-1]
    assert os.path.getsize(last_path) == f.size - last_base  # old bytes past the end cut off
    reader.close()


def test_a_journal_over_an_old_file_holds_only_its_own_bytes(tmp_path: Path) -> None:
    """Journals open their file without O_TRUNC (segments.py: ext4 flushes a truncated
    file at close); a path that still holds bytes is emptied all the same."""
    path = tmp_path / "s"
    path.write_bytes(b"old contents, longer than what follows" * 10)
    f = SegmentedFile(str(path), 1000)
    f.append(b"new")
    f.close()
    assert path.read_bytes() == b"new"
    spare = tmp_path / "spare"
    spare.touch()  # an empty spare file (sparefiles.py) is used as it is
    g = SegmentedFile(str(spare), 1000)
    g.append(b"abc")
    g.close()
    assert spare.read_bytes() == b"abc"


def test_small_data_stays_in_memory_and_moves_to_a_file_when_it_grows(tmp_path: Path) -> None:
    named: list[str] = []

    def name() -> str:
        named.append(str(tmp_path / f"f{len(named)}"))
        return named[-1]

    f = SegmentedFile(name, 100, in_memory_up_to=50)
    reader = f.reader()
    f.append(b"a" * 20, b"b" * 20)
    assert os.listdir(tmp_path) == [] and named == []  # no file, not even a name
    assert reader.pread(100, 0) == b"a" * 20 + b"b" * 20 and reader.pread(5, 40) == b""
    f.append(b"c" * 20)  # past the memory limit: all of it goes to one file
    assert named == [str(tmp_path / "f0")]
    assert (tmp_path / "f0").read_bytes() == b"a" * 20 + b"b" * 20 + b"c" * 20
    assert reader.pread(100, 30) == b"b" * 10 + b"c" * 20  # the same reader
    for i in range(5):  # rotation works as without the memory start
        f.append(bytes([100 + i]) * 60)
    assert f.floor > 0 and len(os.listdir(tmp_path)) == 2
    f.remove()
    reader.close()
    assert os.listdir(tmp_path) == []


def test_a_closed_small_file_is_still_read_and_removing_it_leaves_nothing(tmp_path: Path) -> None:
    f = SegmentedFile(lambda: str(tmp_path / "never"), 1000, in_memory_up_to=4096)
    f.append(b"hello\n")
    f.close()
    assert not f.writable
    with f.reader() as reader:
        assert reader.pread(100, 0) == b"hello\n"
    f.remove()
    assert os.listdir(tmp_path) == []


async def test_a_quiet_command_creates_no_journal_file(tmp_path: Path) -> None:
    ex = Execution("quiet", "echo", str(tmp_path), background=False)
    ex.feed("stdout", b"one line\n")
    ex.finish(0)
    assert os.listdir(tmp_path) == []
    frames = b"".join([c async for c in ex.journal.follow(0)])
    assert b'"text":"one line"' in frames and b"execution_complete" in frames
    start, end, _ = ex.log.read_from_line(0, finished=True)
    assert b"".join([c async for c in ex.log.iter_range(start, end)]) == b"one line\n"
    loud = Execution("loud", "yes", str(tmp_path), background=False)
    loud.feed("stdout", b"y\n" * 10_000)
    loud.finish(0)
    assert sorted(os.listdir(tmp_path)) == ["loud.events", "loud.log"]
    loud.discard()
    ex.discard()
    assert os.listdir(tmp_path) == []


def test_a_file_that_cannot_be_made_keeps_the_data_in_memory(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "f"  # its directory does not exist
    f = SegmentedFile(lambda: str(target), 1000, in_memory_up_to=10)
    f.append(b"12345")
    with pytest.raises(OSError):
        f.append(b"678901")
    assert f.size == 5
    with f.reader() as reader:
        assert reader.pread(100, 0) == b"12345"
    (tmp_path / "missing").mkdir()
    f.append(b"678901")  # the next append makes it
    f.close()
    assert target.read_bytes() == b"12345678901"
