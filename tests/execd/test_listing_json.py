"""``listing`` writes a listing's JSON as text: it must be byte for byte what encoding
``file_info`` dicts gives (the wire the SDK parses), for every kind of entry and however the
walk's runs are cut; ``walk`` gives the entries in the reference's order."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sandlot.execd import listing
from sandlot.execd.fileinfo import file_info
from sandlot.execd.walk import runs, walk
from tests.execd.conftest import Execd


def _encoded(root: Path, depth: int | None) -> bytes:
    return json.dumps([file_info(p, s) for p, s in walk(str(root), max_depth=depth)],
                      ensure_ascii=False, separators=(",", ":")).encode()


def _tree(root: Path) -> None:
    (root / "plain").write_text("x")
    (root / 'ünï "quoted" \\ back\tslash').write_text("yy")
    (root / "looks\\u0000escaped").write_text("")  # a backslash and "u0000" in the name
    (root / "dir" / "deeper").mkdir(parents=True)
    (root / "dir" / "deeper" / "leaf").write_bytes(b"")
    (root / "dir" / "b").write_bytes(b"")
    (root / "link").symlink_to(root / "dir")
    os.mkfifo(root / "fifo")
    os.chmod(root / "plain", 0o4751)
    os.utime(root / "plain", ns=(0, 1_234_567_891))  # sub-second and 1970


def test_listing_text_equals_the_encoded_entries(tmp_path: Path) -> None:
    _tree(tmp_path)
    for depth in (1, 2, 5, None):
        expected = _encoded(tmp_path, depth)
        assert listing.listing_json(str(tmp_path), depth) == expected
        for limit in (1, 2, 3):  # runs cut everywhere: at a directory and inside one
            assert listing.listing_json(str(tmp_path), depth, run_limit=limit) == expected
    parsed = json.loads(listing.listing_json(str(tmp_path), 1))
    kinds = {Path(e["path"]).name: e["type"] for e in parsed}
    assert kinds == {"plain": "file", 'ünï "quoted" \\ back\tslash': "file",
                     "looks\\u0000escaped": "file", "dir": "directory", "link": "symlink",
                     "fifo": "other"}
    (tmp_path / "empty").mkdir()
    assert listing.listing_json(str(tmp_path / "empty"), 1) == b"[]"


def test_a_name_that_is_not_utf8_is_written_with_replacement_characters(tmp_path: Path) -> None:
    """As the reference's JSON encoder: each undecodable byte becomes U+FFFD."""
    os.close(os.open(os.fsencode(tmp_path) + b"/bad\xff\xe2\x82name", os.O_CREAT | os.O_WRONLY))
    (tmp_path / "good").write_text("")
    parsed = json.loads(listing.listing_json(str(tmp_path), 1))
    assert [Path(e["path"]).name for e in parsed] == ["bad\ufffd\ufffd\ufffdname", "good"]


def test_runs_end_where_a_directory_s_contents_follow_and_at_the_limit(tmp_path: Path) -> None:
    for name in "abcde":
        (tmp_path / name).write_text("")
    (tmp_path / "c").unlink()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "inner").write_text("")
    got = [(prefix, names) for prefix, names, _ in runs(str(tmp_path), max_depth=2, limit=2)]
    assert got == [(f"{tmp_path}/", ["a", "b"]), (f"{tmp_path}/", ["c"]),
                   (f"{tmp_path}/c/", ["inner"]), (f"{tmp_path}/", ["d", "e"])]


def test_a_long_listing_over_http_is_the_encoded_entries(execd: Execd) -> None:
    root = execd.workdir / "many"
    root.mkdir()
    for i in range(1500):  # several runs
        (root / f"f{i:05d}").write_text("")
    with execd.client() as c:
        r = c.get("/directories/list", params={"path": str(root)})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.headers["content-length"] == str(len(r.content))
    assert r.content == _encoded(root, 1)


def test_walk_paths_are_joined_once_also_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").write_text("")
    (tmp_path / "b" / "c").write_text("")
    assert [p for p, _ in walk(str(tmp_path), max_depth=2)] == [
        f"{tmp_path}/a", f"{tmp_path}/b", f"{tmp_path}/b/c"]
    top = [p for p, _ in walk("/", max_depth=1)]
    assert top and all(p.startswith("/") and not p.startswith("//") for p in top)
    assert top == sorted(top)
    assert list(walk(str(tmp_path), max_depth=0)) == []


def test_walk_skips_entries_gone_and_keeps_lexical_order_in_subdirectories(
        tmp_path: Path) -> None:
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "b").write_text("")
    (tmp_path / "z" / "a").mkdir()
    (tmp_path / "z" / "a" / "inner").write_text("")
    (tmp_path / "m").write_text("")
    assert [p for p, _ in walk(str(tmp_path), max_depth=None)] == [
        f"{tmp_path}/m", f"{tmp_path}/z", f"{tmp_path}/z/a", f"{tmp_path}/z/a/inner",
        f"{tmp_path}/z/b"]
    assert [p for p, _ in walk(str(tmp_path), max_depth=2)] == [
        f"{tmp_path}/m", f"{tmp_path}/z", f"{tmp_path}/z/a", f"{tmp_path}/z/b"]
    walked = walk(str(tmp_path), max_depth=None)
    assert next(walked)[0] == f"{tmp_path}/m"
    (tmp_path / "z" / "b").unlink()  # gone before the walk reaches it
    assert [p for p, _ in walked] == [f"{tmp_path}/z", f"{tmp_path}/z/a",
                                      f"{tmp_path}/z/a/inner"]


def test_timestamps_are_rfc3339_utc_with_microseconds_truncated() -> None:
    """``iso_ns`` against datetime arithmetic on whole microseconds (no float rounding):
    the fraction is truncated, left out when zero, and seconds before 1970-01-01T00:00:01
    (fewer digits than a second's) or before 1970 come out the same way."""
    from datetime import UTC, datetime, timedelta

    from sandlot.execd.fileinfo import iso_ns

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for ns in (0, 1, 999, 1_000, 999_999_999, 1_000_000_000, 1_234_567_891,
               1_733_480_000_123_456_789, 1_733_480_000_000_000_999, 1_733_480_000_000_001_000,
               253_402_300_799_999_999_999):
        moment = epoch + timedelta(microseconds=ns // 1000)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S")
        expected = f"{text}.{moment.microsecond:06d}Z" if moment.microsecond else f"{text}Z"
        assert iso_ns(ns) == expected, ns
        assert iso_ns(ns) == expected, ns  # from the seconds' cache
    assert iso_ns(-1_500_000_000) == "1969-12-31T23:59:58.500000Z"
