"""``sandlot.hostfs``: ext4 without a journal is found, on real loop-mounted file systems and
on made-up /proc and /sys trees; ``sandlot doctor`` and ``sandlot serve`` warn about it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot import hostfs
from sandlot.cli.doctor import check_data_dir_journal
from sandlot.config import Config, RuntimeConfig
from sandlot.server.main import warn_about_data_dir_fs

NEEDS_TOOLS = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("losetup"),
    reason="needs root, mkfs.ext4 and losetup (e2fsprogs, util-linux)")


@contextlib.contextmanager
def _ext4(tmp: Path, name: str, *, journal: bool) -> Iterator[Path]:
    """A small ext4 (with or without a journal) loop-mounted at ``tmp/name``."""
    image, mount_point = tmp / f"{name}.img", tmp / name
    with open(image, "wb") as fh:
        fh.truncate(32 << 20)
    features = [] if journal else ["-O", "^has_journal"]
    subprocess.run(["mkfs.ext4", "-q", "-F", *features, str(image)], check=True)
    mount_point.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-d", str(mount_point)], check=False)  # -d: frees the loop


@NEEDS_TOOLS
def test_real_ext4_with_and_without_a_journal(tmp_path: Path) -> None:
    with _ext4(tmp_path, "plain", journal=False) as plain, \
            _ext4(tmp_path, "journaled", journal=True) as journaled:
        device = hostfs.ext4_without_journal(plain)
        assert device is not None and device.startswith("loop")
        assert device == hostfs.block_device_name(plain)
        assert hostfs.ext4_without_journal(journaled) is None
        # A folder inside counts as the file system it is on.
        (plain / "data").mkdir()
        assert hostfs.ext4_without_journal(plain / "data") == device

        check = check_data_dir_journal(plain / "data" / "not-made-yet")
        assert check is not None and check.ok is False and not check.required
        assert f"/dev/{device}" in check.detail and "journal" in check.fix
        assert check_data_dir_journal(journaled) is None
    assert not any(line.split()[1].startswith(str(tmp_path))
                   for line in Path("/proc/self/mounts").read_text().splitlines())


@NEEDS_TOOLS
def test_serve_warns_only_for_the_oci_runtime(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with _ext4(tmp_path, "plain", journal=False) as plain:
        with caplog.at_level(logging.WARNING, logger="sandlot.server"):
            warn_about_data_dir_fs(Config(data_dir=plain))
        assert any("without a journal" in r.getMessage() for r in caplog.records)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sandlot.server"):
            warn_about_data_dir_fs(Config(data_dir=plain, runtime=RuntimeConfig(type="docker")))
        assert not caplog.records


def _fake_host(tmp_path: Path, device: str, *, ext4: bool, jbd2: list[str]) -> tuple[Path, Path]:
    """/proc and /sys trees that put ``tmp_path``'s device at ``device``."""
    proc, sys_root, devices = tmp_path / "proc", tmp_path / "sys", tmp_path / "devices"
    st = os.stat(tmp_path)
    (sys_root / "dev" / "block").mkdir(parents=True)
    (devices / device).mkdir(parents=True)
    (sys_root / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(
        devices / device)
    if ext4:
        (proc / "fs" / "ext4" / device).mkdir(parents=True)
    for entry in jbd2:
        (proc / "fs" / "jbd2" / entry).mkdir(parents=True)
    return proc, sys_root


@pytest.mark.parametrize(("ext4", "jbd2", "found"), [
    (True, [], "vdq"),  # ext4, no journal
    (True, ["vdq-8"], None),  # ext4 with its journal
    (True, ["vdq1-8", "loop3-8"], "vdq"),  # other devices' journals do not count
    (False, [], None),  # not ext4 (xfs, btrfs ...)
])
def test_made_up_hosts(tmp_path: Path, ext4: bool, jbd2: list[str], found: str | None) -> None:
    proc, sys_root = _fake_host(tmp_path, "vdq", ext4=ext4, jbd2=jbd2)
    assert hostfs.ext4_without_journal(tmp_path, proc_root=proc, sys_root=sys_root) == found


def test_no_block_device_is_not_ext4(tmp_path: Path) -> None:
    """tmpfs, overlay and network file systems have no /sys/dev/block entry."""
    empty_sys = tmp_path / "sys"
    (empty_sys / "dev" / "block").mkdir(parents=True)
    assert hostfs.block_device_name(tmp_path, empty_sys) is None
    assert hostfs.ext4_without_journal(tmp_path, sys_root=empty_sys) is None
    assert hostfs.block_device_name(Path("/proc")) is None  # procfs: no device at all
