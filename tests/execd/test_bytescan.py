"""execd's output scans: the SIMD path and the standard library's give the same answers and
the same event bytes, for every kind of output the encoder meets."""

from __future__ import annotations

import json
import random

import pytest

from sandlot.execd import bytescan, sse

# Bytes that exercise every branch: controls (escaped), quotes and backslashes, DEL (not a
# JSON control), UTF-8, invalid UTF-8 and the line breakers sse escapes.
_PIECES = [b"a", b"xyz ", b"\t", b"\r", b"\x00", b"\x1b[31m", b"\x1f", b"\x7f", b'"', b"\\",
           "é".encode(), "\u2028".encode(), b"\xff", b"\n", b"\n", b"\n\n"]


def _regions(seed: int, count: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        body = b"".join(rnd.choice(_PIECES) for _ in range(rnd.randint(0, 400)))
        out.append(body + b"\n")  # a region is whole lines
    # long regions of plain lines (the fast path), with one odd byte somewhere
    plain = b"0123456789abcdefghijklmnopqrstuvwxyz\n" * 3000
    for odd in (b"", b"\x01", b"\n", b"\t", b'"'):
        at = rnd.randrange(len(plain))
        out.append(plain[:at] + odd + plain[at:])
    return out


def test_the_simd_library_is_installed_here() -> None:
    # The test run installs sandlot's dependencies: the fallback must not hide a missing one.
    assert bytescan.simd() is not None


@pytest.mark.parametrize("simd", [True, False])
def test_scans_answer_what_the_bytes_hold(simd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not simd:
        monkeypatch.setattr(bytescan, "_sz", None)
    for region in _regions(5, 1500):
        expected = tuple(c for c in range(0x20) if c != 0x0A and bytes((c,)) in region)
        assert bytescan.controls_in(region) == expected
        lines = region.split(b"\n")[:-1]
        assert bytescan.has_blank_line(region) == (b"" in lines)


def test_events_are_the_same_bytes_with_and_without_simd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "now_ms", lambda: 1700000000000)
    regions = _regions(9, 800)
    fast = [sse.encode_region_counted("stdout", r, frames=True) for r in regions]
    monkeypatch.setattr(bytescan, "_sz", None)
    plain = [sse.encode_region_counted("stdout", r, frames=True) for r in regions]
    assert fast == plain
    for (frames, lines), region in zip(fast, regions, strict=True):
        events = frames.split(b"\n\n")[:-1]
        assert len(events) == lines == region.count(b"\n")
        texts = [json.loads(e)["text"] for e in events]
        want = region.decode(errors="replace").split("\n")[:-1]
        assert texts == [t or "\n" for t in want]
