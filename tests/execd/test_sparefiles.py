"""Journal files made ahead of need: handed out empty, topped up, removed on close."""

from __future__ import annotations

import os
from pathlib import Path

from sandlot.execd.sparefiles import SpareFiles


def test_hands_out_made_ahead_files_then_fresh_names(tmp_path: Path) -> None:
    spares = SpareFiles(str(tmp_path), keep=3)
    first = spares.take()  # none made yet: a fresh name the caller creates
    assert not os.path.exists(first)
    spares.top_up()
    assert len(os.listdir(tmp_path)) == 3
    taken = [spares.take() for _ in range(3)]
    assert all(os.path.exists(p) and os.path.getsize(p) == 0 for p in taken)
    fresh = spares.take()  # used up again
    assert not os.path.exists(fresh)
    assert len({first, *taken, fresh}) == 5
    spares.close()


def test_close_removes_the_files_not_handed_out(tmp_path: Path) -> None:
    spares = SpareFiles(str(tmp_path), keep=4)
    spares.top_up()
    kept = spares.take()
    spares.close()
    assert os.listdir(tmp_path) == [Path(kept).name]
    spares.top_up()  # closed: makes nothing
    assert os.listdir(tmp_path) == [Path(kept).name]


def test_a_vanished_directory_falls_back_to_fresh_names(tmp_path: Path) -> None:
    spares = SpareFiles(str(tmp_path / "gone"), keep=2)
    spares.top_up()  # cannot create: no error
    paths = [spares.take() for _ in range(3)]
    assert len(set(paths)) == 3
