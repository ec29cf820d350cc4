"""Issue 11, finding 5: a delete racing file activity in the sandbox's tree never fails."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from sandlot.runtime.oci.removal import BackgroundRemovals, is_trash, remove_tree, set_aside


def _churn(root: Path, stop: threading.Event) -> None:
    """Create and delete files and directories as fast as possible until the tree is gone."""
    i = 0
    while not stop.is_set():
        d = root / f"d{i % 50}"
        try:
            d.mkdir(exist_ok=True)
            (d / f"f{i}").write_bytes(b"x")
            (d / f"f{i}").unlink()
            if i % 7 == 0:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            if not root.exists():
                return
        i += 1


def _populated(tmp: Path) -> Path:
    root = tmp / "sandbox"
    for d in range(50):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(40):
            (root / f"d{d}" / f"seed{f}").write_bytes(b"y")
    return root


@pytest.mark.parametrize("run", range(3))
def test_removal_racing_file_activity_succeeds(tmp_path: Path, run: int) -> None:
    root = _populated(tmp_path)
    stop = threading.Event()
    workers = [threading.Thread(target=_churn, args=(root, stop)) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        remove_tree(root)
    finally:
        stop.set()
        for w in workers:
            w.join()
    remove_tree(root)  # whatever the last churn left, and idempotent
    assert not root.exists()


def test_removal_of_missing_tree_is_a_no_op(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never-was")
    os.symlink("/etc", tmp_path / "link")
    remove_tree(tmp_path / "link")  # a symlink is removed, never followed
    assert Path("/etc/passwd").exists() and not (tmp_path / "link").exists()


async def test_a_tree_set_aside_frees_its_path_at_once_and_goes_in_the_background(
        tmp_path: Path) -> None:
    root = _populated(tmp_path)
    trash = set_aside(root)
    assert trash is not None and is_trash(trash.name) and trash.parent == tmp_path
    assert not root.exists() and (trash / "d0" / "seed0").exists()
    root.mkdir()  # the path is free for a new sandbox of the same id
    removals = BackgroundRemovals()
    removals.remove(trash)
    await removals.wait()
    assert not trash.exists() and root.is_dir()
    assert set_aside(tmp_path / "never-was") is None


async def test_a_failed_background_removal_is_logged_and_left_for_the_sweep(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    parent = tmp_path / "locked"
    root = _populated(parent)
    trash = set_aside(root)
    assert trash is not None
    # Not removable: the trash is bound read-only onto itself (its files refuse the unlink).
    subprocess.run(["mount", "--bind", str(trash), str(trash)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(trash)], check=True)
        removals = BackgroundRemovals()
        with caplog.at_level(logging.WARNING):
            removals.remove(trash)
            await asyncio.wait_for(removals.wait(), 30)
        assert trash.exists()
        assert "the next start removes it" in caplog.text
    finally:
        subprocess.run(["umount", str(trash)], check=True)
    remove_tree(trash)
    assert not trash.exists()
