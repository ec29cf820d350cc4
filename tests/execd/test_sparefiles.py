"""Journal files made ahead of need: handed out empty, topped up, removed on close."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sandlot.execd.sparefiles import SpareFiles


def _wait_for(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_hands_out_distinct_paths_and_keeps_files_ready(tmp_path: Path) -> None:
    spares = SpareFiles(str(tmp_path), keep=4)
    try:
        first = spares.take()  # none ready yet: a fresh name the caller creates
        assert not os.path.exists(first)
        assert _wait_for(lambda: len(os.listdir(tmp_path)) == 4)
        taken = [spares.take() for _ in range(4)]
        assert all(os.path.getsize(p) == 0 for p in taken)  # made ahead, empty
        assert len({first, *taken}) == 5
        assert _wait_for(lambda: len(set(os.listdir(tmp_path)) - {Path(p).name for p in taken})
                         == 4)
    finally:
        spares.close()


def test_close_removes_the_files_not_handed_out(tmp_path: Path) -> None:
    spares = SpareFiles(str(tmp_path), keep=3)
    kept = spares.take()
    assert _wait_for(lambda: len(os.listdir(tmp_path)) == 3)
    spares.close()
    time.sleep(0.1)
    assert os.listdir(tmp_path) == []
    assert spares.take() != kept  # still usable: fresh names only


def test_a_vanished_directory_falls_back_to_fresh_names(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    spares = SpareFiles(str(gone), keep=2)
    try:
        paths = [spares.take() for _ in range(3)]
        assert len(set(paths)) == 3
        assert not gone.exists()
    finally:
        spares.close()
