"""Unit tests of execd's pieces with fakes: cgroup discovery and limits (v1 and v2), SSE
encoding and keep-alives, journals and line cursors, env-file parsing, range parsing, globs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandlot.execd import envfile, sse
from sandlot.execd.files import glob_matcher, parse_mode, parse_range
from sandlot.execd.journal import EventJournal, OutputLog
from sandlot.execd.lines import LineFramer, split_region
from sandlot.execd.metrics import CgroupPaths, Sampler


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limits(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "cpu memory")
    box = root / "sandlot" / "box1"
    write(box / "memory.current", str(300 << 20))
    write(box / "memory.max", str(512 << 20))
    write(box / "memory.stat", f"anon 1\ninactive_file {100 << 20}\n")
    write(box / "cpu.max", "150000 100000")
    write(box / "cpu.stat", "usage_usec 5000000\nuser_usec 1\n")
    write(tmp_path / "self-cgroup", "0::/sandlot/box1\n")
    paths = CgroupPaths.discover(str(tmp_path / "self-cgroup"), str(root))
    assert paths.v2 == str(box)
    s = Sampler(paths)
    assert s.cpu_count() == 1.5
    used, total = s.memory()
    assert total == 512 << 20 and used == 200 << 20
    assert s.cpu_seconds() == 5.0


def test_cgroup_v2_unlimited_falls_back_to_host(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "cpu memory")
    write(root / "memory.current", "1000")
    write(root / "memory.max", "max")
    write(root / "cpu.max", "max 100000")
    write(tmp_path / "self-cgroup", "0::/\n")
    s = Sampler(CgroupPaths.discover(str(tmp_path / "self-cgroup"), str(root)))
    used, total = s.memory()
    assert total > 1000 and 0 < used <= total  # the host's memory
    assert s.cpu_count() >= 1


def test_cgroup_v1_limits_inside_a_container(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    # Inside a container the cgroup's own directory is the mount root.
    write(root / "memory" / "memory.usage_in_bytes", str(64 << 20))
    write(root / "memory" / "memory.limit_in_bytes", str(256 << 20))
    write(root / "memory" / "memory.stat", "total_inactive_file 0\n")
    write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "50000")
    write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000")
    write(root / "cpu,cpuacct" / "cpuacct.usage", "2000000000")
    write(
        tmp_path / "self-cgroup",
        "5:memory:/sandlot/box2\n4:cpu,cpuacct:/sandlot/box2\n0::/\n",
    )
    paths = CgroupPaths.discover(str(tmp_path / "self-cgroup"), str(root))
    assert paths.memory == str(root / "memory")
    s = Sampler(paths)
    assert s.memory() == (float(64 << 20), float(256 << 20))
    assert s.cpu_count() == 0.5
    assert s.cpu_seconds() == 2.0
    sample = s.sample()
    assert sample["mem_total_mib"] == 256.0 and sample["mem_used_mib"] == 64.0


def test_cgroup_v1_huge_limit_means_unlimited(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root / "memory" / "box" / "memory.usage_in_bytes", "4096")
    write(root / "memory" / "box" / "memory.limit_in_bytes", str(9223372036854771712))
    write(tmp_path / "self-cgroup", "5:memory:/box\n")
    s = Sampler(CgroupPaths.discover(str(tmp_path / "self-cgroup"), str(root)))
    used, total = s.memory()
    assert total < 9223372036854771712 and used > 4096


def test_reference_framing_is_the_json_line_and_a_blank_line() -> None:
    frame = sse.encode(sse.stdout_event("a\nb\u2028c\x85"), event_id=42).decode()
    assert frame.endswith("\n\n") and len(frame[:-2].splitlines()) == 1
    assert json.loads(frame)["text"] == "a\nb\u2028c\x85"
    assert json.loads(sse.ping_frame())["type"] == "ping"


def test_sse_encoding_is_one_line_json_with_id() -> None:
    frame = sse.encode(sse.stdout_event("a\nb\u2028c\x85"), event_id=42, sse=True).decode()
    lines = frame.split("\n")
    assert lines[0] == "id: 42" and lines[1].startswith("data: ") and frame.endswith("\n\n")
    data = json.loads(lines[1][6:])
    assert data["type"] == "stdout" and data["text"] == "a\nb\u2028c\x85"
    assert len(lines[1].splitlines()) == 1
    err = sse.error_event("CommandExecError", "3", ["boom"])
    assert err["error"] == {"ename": "CommandExecError", "evalue": "3", "traceback": ["boom"]}


async def test_keepalive_interleaves_comments_and_closes_the_source() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        try:
            yield b"one"
            await asyncio.sleep(0.35)
            yield b"two"
        finally:
            closed.set()

    got = [chunk async for chunk in sse.with_keepalive(slow(), 0.1)]
    assert got[0] == b"one" and got[-1] == b"two"
    assert got.count(sse.KEEPALIVE) >= 2
    assert closed.is_set()


async def test_journal_follow_and_resume(tmp_path: Path) -> None:
    j = EventJournal(str(tmp_path / "j"))
    ids = [j.append(sse.stdout_event(f"line{i}")) for i in range(3)]

    async def collect(start: int) -> list[tuple[int, dict]]:
        out = []
        async for chunk in j.follow(start, sse_frames=True):
            for frame in chunk.decode().split("\n\n"):
                if frame:
                    head, data = frame.split("\n")
                    out.append((int(head[4:]), json.loads(data[6:])))
        return out

    reader = asyncio.create_task(collect(0))
    await asyncio.sleep(0.05)
    ids.append(j.append(sse.stdout_event("late")))
    j.close()
    events = await reader
    assert [i for i, _ in events] == ids
    assert [e["text"] for _, e in events] == ["line0", "line1", "line2", "late"]
    resumed = await collect(j.resume_offset(str(ids[1])))
    assert [e["text"] for _, e in resumed] == ["line2", "late"]
    assert await collect(j.resume_offset("garbage")) == events
    plain = b"".join([chunk async for chunk in j.follow(0)])  # the reference's framing
    assert [json.loads(f)["text"] for f in plain.split(b"\n\n")[:-1]] == [
        "line0", "line1", "line2", "late"]
    j.discard()
    assert not (tmp_path / "j").exists()


def test_output_log_cursor_past_index_blocks(tmp_path: Path) -> None:
    log = OutputLog(str(tmp_path / "log"))
    for i in range(5000):
        log.write(f"l{i}\n".encode())
    log.write(b"partial")
    start, end, nxt = log.read_from_line(4998, finished=False)
    data = open(tmp_path / "log", "rb").read()
    assert data[start:end] == b"l4998\nl4999\n" and nxt == 5000
    start, end, nxt = log.read_from_line(4998, finished=True)
    assert data[start:end] == b"l4998\nl4999\npartial" and nxt == 5001
    start, end, nxt = log.read_from_line(None, finished=False)
    assert (start, end) == (0, len(data))
    log.discard()


def test_env_file_forms(tmp_path: Path) -> None:
    p = tmp_path / "envs"
    p.write_text('A=\'x y\'\nB="q\\"uote\\nnl"\n# c\nexport C=plain\nbad line\n')
    assert envfile.parse(p.read_text()) == {"A": "x y", "B": 'q"uote\nnl', "C": "plain"}
    ef = envfile.EnvFile(str(p))
    assert ef.values()["A"] == "x y"
    p.write_text("A=changed-and-longer\n")
    assert ef.values() == {"A": "changed-and-longer"}


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-9", 100, (0, 10)),
        ("bytes=90-", 100, (90, 100)),
        ("bytes=-5", 100, (95, 100)),
        ("bytes=95-200", 100, (95, 100)),
        ("bytes=100-", 100, None),
        ("items=0-1", 100, None),
        ("bytes=5-2", 100, None),
    ],
)
def test_parse_range(header: str, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


def test_search_globs_match_base_names_as_doublestar() -> None:
    # The reference matches each file's base name (doublestar, with {a,b} and **).
    assert glob_matcher("*.py")("c.py") and not glob_matcher("*.py")("c.txt")
    assert glob_matcher("*.{py,txt}")("c.txt") and glob_matcher("*.{py,txt}")("c.py")
    assert glob_matcher("**/*.py")("z.py") and glob_matcher("**")("anything")
    assert not glob_matcher("src/*.py")("z.py")  # a base name has no directory part
    assert glob_matcher("*")(".hidden") and glob_matcher("[ab].md")("a.md")
    assert parse_mode(755, default=0) == 0o755 and parse_mode("0644", default=0) == 0o644
    assert parse_mode(None, default=0o600) == 0o600
    with pytest.raises(Exception):  # noqa: B017 - sandlot InvalidRequest
        parse_mode(999, default=0)


def test_output_events_decode_to_each_line_with_blank_lines_as_newline() -> None:
    import random

    rnd = random.Random(7)
    alphabet = ["a", '"', "\\", "\r", "\t", "\x00", "\x1f", "\x7f", "é", "\u2028"]
    alphabet += ["\u2029", "\x85", "😀", "</", "\x0b", " "]
    for _ in range(3000):
        texts = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
                 for _ in range(rnd.randint(1, 4))]
        blob = sse.encode_lines("stderr", [t.encode() for t in texts])
        decoded = blob.decode()  # valid UTF-8 whatever the text
        lines = decoded.split("\n")
        assert len(lines) == len(texts)
        for line, text in zip(lines, texts, strict=True):
            assert "\r" not in line
            assert not any(ch in line for ch in ("\x85", "\u2028", "\u2029"))
            event = json.loads(line)
            assert event["type"] == "stderr" and event["text"] == (text or "\n")
            assert isinstance(event["timestamp"], int)


def test_output_events_with_control_characters_match_the_json_encoder() -> None:
    # ANSI colours, backspace, form feed, NUL: escaped as Python's JSON encoder escapes them,
    # in the same pass as plain text (no per-line path).
    lines = [b"\x1b[31mred\x1b[0m\tok\x08\x0c\x00", b"", b'say "hi" \\ \r done']
    blob = sse.encode_lines("stdout", lines)
    for raw, encoded in zip(lines, blob.split(b"\n"), strict=True):
        event = json.loads(encoded)
        text = raw.decode() or "\n"
        assert event["text"] == text
        expected = json.dumps({"type": "stdout", "timestamp": event["timestamp"], "text": text},
                              ensure_ascii=False, separators=(",", ":"))
        assert encoded == expected.encode()


def test_output_events_replace_invalid_utf8() -> None:
    event = json.loads(sse.encode_lines("stdout", [b"ok\xff\xfe"]))
    assert event["text"] == "ok\ufffd\ufffd"


def _frame(chunks: list[bytes], *, session: bool = False) -> list[bytes]:
    framer = LineFramer(session=session)
    region = b"".join(framer.feed(chunk) for chunk in chunks) + framer.flush()
    return split_region(region)


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"a\nb\n", [b"a", b"b"]),
        (b"a\r\nb\r\n", [b"a", b"b"]),  # \r\n ends a line once
        (b"a\rb\r", [b"a", b"b"]),  # \r alone ends a line
        (b"a\n\nb\n", [b"a", b"", b"b"]),  # a blank line (sent as "\n")
        (b"\r\n", [b""]),
        (b"a\n\r\n", [b"a", b""]),
        (b"a\r\r\nb", [b"a", b"", b"b"]),
        (b"tail", [b"tail"]),  # the unterminated last line, at the end
        (b"", []),
    ],
)
def test_command_output_is_framed_into_lines_as_the_reference(
    data: bytes, lines: list[bytes]
) -> None:
    assert _frame([data]) == lines
    # The same lines whatever the read boundaries (a \r\n split between reads counts once).
    for cut in range(len(data) + 1):
        assert _frame([data[:cut], data[cut:]]) == lines


def test_session_output_is_framed_as_a_line_scanner() -> None:
    data = b"a\r\n\nb\rc\n\n\ntail\r"
    assert _frame([data], session=True) == [b"a", b"b\rc", b"tail"]
    for cut in range(len(data) + 1):
        assert _frame([data[:cut], data[cut:]], session=True) == [b"a", b"b\rc", b"tail"]


def test_a_line_longer_than_the_cap_is_sent_in_pieces_on_character_boundaries() -> None:
    framer = LineFramer(max_line=10)
    data = "é" * 12  # 24 bytes, 2 per character
    pieces = split_region(framer.feed(data.encode()) + framer.feed(b"\n"))
    assert b"".join(pieces).decode() == data
    assert all(len(p) <= 10 for p in pieces) and len(pieces) == 3
    for piece in pieces:
        piece.decode()  # never a split character


def test_a_partial_line_of_exactly_the_cap_is_sent_whole() -> None:
    framer = LineFramer(max_line=8)
    assert framer.feed(b"abcdefgh") == b"abcdefgh\n"  # was an IndexError at the cut
    assert not framer.verbatim and framer.flush() == b""


def test_region_line_counts_and_verbatim_reads_agree_with_counting() -> None:
    # Execution.feed gives the encoder's line count to the output log when the framer's
    # lines hold exactly the read's newlines (no \r rewritten, no line dropped or cut).
    import random

    rnd = random.Random(11)
    alphabet = [b"a", b"\n", b"\n", b"\r", b"\r\n", b'"', b"\x1b", b"\xff", b"xyz"]
    for session in (False, True):
        framer = LineFramer(session=session, max_line=16)
        for _ in range(3000):
            data = b"".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 10)))
            region = framer.feed(data)
            if region:
                _, lines = sse.encode_region_counted("stdout", region, frames=True)
                assert lines == region.count(b"\n")
            if framer.verbatim:
                assert region.count(b"\n") == data.count(b"\n")


def test_output_log_cursor_with_any_chunking(tmp_path: Path) -> None:
    import random

    rnd = random.Random(3)
    lines = [b"x" * rnd.randint(0, 40) + b"\n" for _ in range(6000)]
    data = b"".join(lines) + b"tail"
    log = OutputLog(str(tmp_path / "log"))
    pos = 0
    while pos < len(data):  # writes of any size, splitting lines anywhere
        n = rnd.choice([1, 7, 100, 5000, 70000])
        log.write(data[pos : pos + n])
        pos += n
    assert log.lines == 6000
    for cursor in [0, 1, 1023, 1024, 1025, 2047, 2048, 4097, 5999, 6000, 6001]:
        start, end, nxt = log.read_from_line(cursor, finished=True)
        tail = b"tail" if cursor <= 6000 else b""
        assert data[start:end] == b"".join(lines[cursor:]) + tail, cursor
        assert nxt == 6001
        start, end, nxt = log.read_from_line(cursor, finished=False)
        assert data[start:end] == b"".join(lines[cursor:]), cursor
        assert nxt == 6000
    log.discard()


async def test_journal_follow_sends_keepalives_while_silent(tmp_path: Path) -> None:
    j = EventJournal(str(tmp_path / "j"))
    j.append(sse.stdout_event("first"))

    async def late() -> None:
        await asyncio.sleep(0.35)
        j.append(sse.stdout_event("late"))
        j.close()

    writer = asyncio.create_task(late())
    got = [chunk async for chunk in j.follow(0, keepalive=0.1, sse_frames=True)]
    await writer
    assert b'"first"' in got[0] and b'"late"' in got[-1]
    assert 2 <= got.count(sse.KEEPALIVE) <= 4
    pings = [c for c in [chunk async for chunk in j.follow(0, keepalive=0.0001)]
             if b'"ping"' in c]
    assert not pings  # a closed journal is read straight through
    # without keepalive: only events
    assert sse.KEEPALIVE not in [chunk async for chunk in j.follow(0)]
    j.discard()


async def _asgi_stream(
    response: object, disconnect_after: float | None
) -> tuple[list[dict], bool]:
    """Run an SSE response as uvicorn would; returns the messages sent and if receive ended."""
    sent: list[dict] = []
    gone = asyncio.Event()

    async def receive() -> dict:
        if disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(disconnect_after or 0)
        gone.set()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
    await asyncio.wait_for(response(scope, receive, send), 5)  # type: ignore[operator]
    return sent, gone.is_set()


async def test_self_ending_stream_sends_the_source_and_ends() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    sent, _ = await _asgi_stream(sse.self_ending_sse_response(frames()), None)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert [m["body"] for m in sent[1:]] == [b"a", b"b", b""]
    assert sent[-1]["more_body"] is False


async def test_self_ending_stream_stops_and_closes_its_source_when_the_client_goes() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield sse.KEEPALIVE
                await asyncio.sleep(0.05)
        finally:
            closed.set()

    sent, gone = await _asgi_stream(sse.self_ending_sse_response(endless()), 0.2)
    assert gone and closed.is_set()
    assert 2 <= len(sent) - 1 <= 8  # stopped at the chunk after the disconnect


def test_session_env_dump_keeps_what_the_reference_persists() -> None:
    from sandlot.execd.sessions import MAX_PERSISTED_VALUE, parse_env_dump

    big = "x" * (MAX_PERSISTED_VALUE + 1)
    dump = b"\0".join(
        f"{k}={v}".encode()
        for k, v in {"KEEP": "a=b\nc", "PS1": "$ ", "PROMPT_COMMAND": "x", "BIG": big,
                     "EMPTY": ""}.items()
    ) + b"\0bad name=1\0"
    assert parse_env_dump(dump) == {"KEEP": "a=b\nc", "EMPTY": ""}


async def test_journals_are_capped_and_keep_offsets(tmp_path: Path) -> None:
    """Issue 11: an execution's journals drop their oldest part past the cap; event ids
    (offsets) and line numbers keep their meaning, and readers skip what was dropped."""
    cap = 4096
    j = EventJournal(str(tmp_path / "j"), max_bytes=cap)
    log = OutputLog(str(tmp_path / "log"), max_bytes=cap)
    ids = []
    for i in range(2000):
        ids.append(j.append({"type": "stdout", "text": f"line-{i}"}))
        log.write(f"line-{i}\n".encode())
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert on_disk <= 2 * (cap + 64), sorted(p.name for p in tmp_path.iterdir())
    assert j.size > 10 * cap and log.lines == 2000  # logical sizes go on
    j.close()
    log.seal()

    frames = [f async for f in j.follow(0, sse_frames=True)]
    events = [ln for f in frames for ln in f.decode().split("\n") if ln.startswith("id: ")]
    kept = [int(e[4:]) for e in events]
    assert kept and kept[0] == j.floor and kept[-1] == ids[-1]
    assert set(kept) <= set(ids)  # ids are still the events' own offsets
    # Resume after an event still kept: the next one; after a dropped one: the oldest kept.
    assert j.resume_offset(str(kept[1])) == kept[2]
    assert j.resume_offset(str(ids[0])) == j.floor

    start, end, total = log.read_from_line(1990, finished=True)
    text = b"".join([c async for c in log.iter_range(start, end)]).decode()
    assert text == "".join(f"line-{i}\n" for i in range(1990, 2000)) and total == 2000
    start, end, _ = log.read_from_line(0, finished=True)  # long dropped: the oldest kept on
    text = b"".join([c async for c in log.iter_range(start, end)]).decode()
    assert text.endswith("line-1999\n") and len(text) <= cap + 64
    j.discard()
    log.discard()
    assert list(tmp_path.iterdir()) == []
