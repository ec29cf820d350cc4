"""``files.listing_json`` writes a listing's JSON as text: it must be byte for byte what
encoding ``file_info`` dicts gives (the wire the SDK parses), for every kind of entry."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sandlot.execd import files


def test_listing_text_equals_the_encoded_entries(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    (tmp_path / 'ünï "quoted" \\ back\tslash').write_text("yy")
    (tmp_path / "dir" / "deeper").mkdir(parents=True)
    (tmp_path / "dir" / "deeper" / "leaf").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    os.chmod(tmp_path / "plain", 0o4751)
    os.utime(tmp_path / "plain", ns=(0, 1_234_567_891))  # sub-second and 1970
    for depth in (1, 2, 5):
        walked = list(files.walk(str(tmp_path), max_depth=depth))
        expected = json.dumps([files.file_info(p, s) for p, s in walked],
                              ensure_ascii=False, separators=(",", ":")).encode()
        assert files.listing_json(walked) == expected
    parsed = json.loads(files.listing_json(files.walk(str(tmp_path), max_depth=1)))
    kinds = {Path(e["path"]).name: e["type"] for e in parsed}
    assert kinds == {"plain": "file", 'ünï "quoted" \\ back\tslash': "file",
                     "dir": "directory", "link": "symlink", "fifo": "other"}
    assert files.listing_json([]) == b"[]"


def test_walk_paths_are_joined_once_also_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").write_text("")
    (tmp_path / "b" / "c").write_text("")
    assert [p for p, _ in files.walk(str(tmp_path), max_depth=2)] == [
        f"{tmp_path}/a", f"{tmp_path}/b", f"{tmp_path}/b/c"]
    top = [p for p, _ in files.walk("/", max_depth=1)]
    assert top and all(p.startswith("/") and not p.startswith("//") for p in top)
    assert top == sorted(top)
    assert list(files.walk(str(tmp_path), max_depth=0)) == []


def test_walk_skips_entries_gone_and_keeps_lexical_order_in_subdirectories(
        tmp_path: Path) -> None:
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "b").write_text("")
    (tmp_path / "z" / "a").mkdir()
    (tmp_path / "z" / "a" / "inner").write_text("")
    (tmp_path / "m").write_text("")
    assert [p for p, _ in files.walk(str(tmp_path), max_depth=None)] == [
        f"{tmp_path}/m", f"{tmp_path}/z", f"{tmp_path}/z/a", f"{tmp_path}/z/a/inner",
        f"{tmp_path}/z/b"]
    assert [p for p, _ in files.walk(str(tmp_path), max_depth=2)] == [
        f"{tmp_path}/m", f"{tmp_path}/z", f"{tmp_path}/z/a", f"{tmp_path}/z/b"]
    walked = files.walk(str(tmp_path), max_depth=None)
    assert next(walked)[0] == f"{tmp_path}/m"
    (tmp_path / "z" / "b").unlink()  # gone before the walk reaches it
    assert [p for p, _ in walked] == [f"{tmp_path}/z", f"{tmp_path}/z/a",
                                      f"{tmp_path}/z/a/inner"]
