"""``sandlot doctor`` before the first start must not make the data dir so that ``sandlot
serve`` then refuses it: doctor's overlay check created a missing data dir 0755 ("accessible
to other users"), and ``make run`` failed after it."""

from __future__ import annotations

from pathlib import Path

from sandlot import datadir
from sandlot.cli.doctor import check_overlay


def test_doctor_makes_a_missing_data_dir_private(tmp_path: Path) -> None:
    data = tmp_path / "var" / "lib" / "sandlot"
    check = check_overlay(data)
    assert check.name == "overlayfs"
    assert data.stat().st_mode & 0o777 == 0o700
    datadir.check(data)  # what sandlot serve checks at start: no UnsafeDataDir
    assert not [p for p in data.iterdir() if p.name.startswith(".doctor-")]
