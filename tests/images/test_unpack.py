"""Layer extraction: whiteouts, ownership and modes, and refusal of hostile archives."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from sandlot.images.unpack import UnsafeArchiveError, apply_layer
from tests.images.oci_util import TarBuilder


def apply(rootfs: Path, tar: TarBuilder, whiteouts: bool = True) -> None:
    apply_layer(io.BytesIO(tar.bytes()), rootfs, whiteouts=whiteouts)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    root.mkdir()
    return root


def test_whiteouts_delete_lower_files_and_opaque_dirs_keep_own_entries(rootfs: Path) -> None:
    apply(
        rootfs,
        TarBuilder()
        .dir("etc")
        .file("etc/keep", b"k")
        .file("etc/gone", b"g")
        .dir("opt")
        .file("opt/old1", b"1")
        .dir("opt/sub")
        .file("opt/sub/old2", b"2"),
    )
    apply(
        rootfs,
        TarBuilder()
        .file("etc/.wh.gone")
        .dir("opt")
        .file("opt/new-before", b"n")
        .file("opt/.wh..wh..opq")
        .file("opt/new-after", b"m"),
    )
    assert (rootfs / "etc/keep").read_bytes() == b"k"
    assert not (rootfs / "etc/gone").exists()
    assert not (rootfs / "etc/.wh.gone").exists()
    assert sorted(os.listdir(rootfs / "opt")) == ["new-after", "new-before"]


def test_whiteout_in_missing_dir_creates_nothing(rootfs: Path) -> None:
    apply(rootfs, TarBuilder().file("nowhere/.wh.x"))
    assert os.listdir(rootfs) == []


def test_owner_mode_and_setuid_kept(rootfs: Path) -> None:
    apply(
        rootfs,
        TarBuilder()
        .dir("usr")
        .file("usr/su", b"#!", mode=0o4755, uid=0, gid=0)
        .file("usr/mine", b"x", mode=0o640, uid=1234, gid=4321),
    )
    st = os.lstat(rootfs / "usr/su")
    assert stat.S_IMODE(st.st_mode) == 0o4755
    mine = os.lstat(rootfs / "usr/mine")
    assert (mine.st_uid, mine.st_gid, stat.S_IMODE(mine.st_mode)) == (1234, 4321, 0o640)


def test_absolute_and_relative_symlinks_are_stored_verbatim(rootfs: Path) -> None:
    apply(rootfs, TarBuilder().dir("etc").symlink("etc/localtime", "/usr/share/zoneinfo/UTC"))
    assert os.readlink(rootfs / "etc/localtime") == "/usr/share/zoneinfo/UTC"


def test_later_layer_replaces_symlink_with_directory_without_following_it(
    rootfs: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    apply(rootfs, TarBuilder().symlink("lib", str(outside)))
    apply(rootfs, TarBuilder().dir("lib").file("lib/x.so", b"elf"))
    assert (rootfs / "lib").is_dir() and not (rootfs / "lib").is_symlink()
    assert (rootfs / "lib/x.so").read_bytes() == b"elf"
    assert os.listdir(outside) == []


def test_hardlink_inside_rootfs(rootfs: Path) -> None:
    apply(rootfs, TarBuilder().file("a", b"data").hardlink("b", "a"))
    assert os.lstat(rootfs / "a").st_ino == os.lstat(rootfs / "b").st_ino


@pytest.mark.parametrize(
    "evil",
    [
        pytest.param(lambda: TarBuilder().file("../escape", b"x"), id="dotdot"),
        pytest.param(lambda: TarBuilder().file("a/../../escape", b"x"), id="nested-dotdot"),
        pytest.param(lambda: TarBuilder().file("/tmp/sandlot-abs-escape", b"x"), id="absolute"),
        pytest.param(lambda: TarBuilder().device("usr/evil-mem", 1, 1), id="device-node"),
        pytest.param(lambda: TarBuilder().hardlink("shadow", "../../etc/shadow"), id="hardlink"),
        pytest.param(lambda: TarBuilder().hardlink("shadow", "/etc/shadow"), id="hardlink-abs"),
    ],
)
def test_malicious_members_are_rejected(rootfs: Path, evil) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsafeArchiveError):
        apply(rootfs, evil())
    assert not (rootfs.parent / "escape").exists()
    assert not Path("/tmp/sandlot-abs-escape").exists()
    assert not (rootfs / "usr/evil-mem").exists()


def test_symlink_escape_is_rejected(rootfs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "host-etc"
    outside.mkdir()
    tar = TarBuilder().symlink("evil", str(outside)).file("evil/passwd", b"pwned")
    with pytest.raises(UnsafeArchiveError, match="symlink"):
        apply(rootfs, tar)
    assert os.listdir(outside) == []


def test_symlink_escape_across_layers_is_rejected(rootfs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    apply(rootfs, TarBuilder().symlink("up", "../host"))
    with pytest.raises(UnsafeArchiveError):
        apply(rootfs, TarBuilder().file("up/planted", b"x"))
    with pytest.raises(UnsafeArchiveError):
        apply(rootfs, TarBuilder().file("up/.wh..wh..opq"))  # whiteouts must not follow it
    assert os.listdir(outside) == []


def test_hardlink_through_symlink_is_rejected(rootfs: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    apply(rootfs, TarBuilder().symlink("s", str(secret)))
    with pytest.raises(UnsafeArchiveError):
        apply(rootfs, TarBuilder().hardlink("copy", "s"))
    assert not (rootfs / "copy").exists()


def test_device_nodes_under_dev_are_dropped(rootfs: Path) -> None:
    apply(rootfs, TarBuilder().dir("dev").device("dev/null", 1, 3).file("etc-ok", b"y"))
    assert os.listdir(rootfs / "dev") == []
    assert (rootfs / "etc-ok").exists()


def test_plain_rootfs_mode_skips_whiteout_entries(rootfs: Path) -> None:
    apply(rootfs, TarBuilder().file("keep", b"1"), whiteouts=False)
    apply(rootfs, TarBuilder().file(".wh.keep"), whiteouts=False)
    assert (rootfs / "keep").exists() and not (rootfs / ".wh.keep").exists()


@pytest.mark.parametrize("compressor", [["gzip", "-c"], ["zstd", "-q", "-c"]])
def test_compressed_layers(rootfs: Path, tmp_path: Path, compressor: list[str]) -> None:
    import subprocess

    from sandlot.images.unpack import open_layer

    plain = tmp_path / "layer.tar"
    plain.write_bytes(TarBuilder().file("compressed-ok", b"yes").bytes())
    packed = tmp_path / "layer.blob"
    with open(packed, "wb") as out:
        subprocess.run([*compressor, str(plain)], stdout=out, check=True)
    with open_layer(packed) as stream:
        apply_layer(stream, rootfs)
    assert (rootfs / "compressed-ok").read_bytes() == b"yes"
