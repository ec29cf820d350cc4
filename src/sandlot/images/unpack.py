"""Apply image layer tarballs onto a rootfs directory, safely.

Why tarfile with our own checks rather than the stdlib ``data`` filter or umoci: the ``data``
filter rejects absolute symlinks (every Debian rootfs has them, they are resolved inside the
container) and strips setuid bits and owners (``sudo``, ``passwd`` must keep working); umoci
silently rewrites absolute member names instead of rejecting them, creates device nodes, and
hashes every file for its mtree manifest. So extraction goes through ``tarfile`` with the
stdlib's ``fully_trusted`` behaviour, after these checks on every member:

- names are relative and have no ``..`` component (else the archive is rejected);
- no member is written through a symlink or a non-directory already in the rootfs, so a
  planted ``evil -> /etc`` cannot redirect later members to the host;
- hard links point at an existing, non-symlink file inside the rootfs;
- device nodes are never created: those under ``dev/`` (rootfs tarballs carry them, the runtime
  mounts its own /dev) are dropped, any elsewhere reject the archive;
- OCI whiteouts (``.wh.NAME``, ``.wh..wh..opq``) delete what lower layers put there.

Owners, modes (setuid included) and ``security.capability`` xattrs are kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from sandlot.errors import ImagePullError

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ALLOWED_XATTRS = ("security.capability", "user.")


class UnsafeArchiveError(ImagePullError):
    """An archive tried to escape its rootfs or create something it must not."""

    code = "UNSAFE_IMAGE"


@contextlib.contextmanager
def open_layer(path: Path) -> Iterator[IO[bytes]]:
    """Yield an uncompressed byte stream of a layer blob (tar, tar+gzip/bzip2/xz, tar+zstd)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != _ZSTD_MAGIC:
        with open(path, "rb") as fh:
            yield fh
        return
    # zstd is not in this Python's stdlib; the zstd tool streams it for us.
    if shutil.which("zstd") is None:
        raise ImagePullError("layer is zstd-compressed and the zstd tool is not installed")
    proc = subprocess.Popen(["zstd", "-dc", "--", str(path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        yield proc.stdout
    finally:
        proc.stdout.close()
        if proc.wait() not in (0, None) and proc.returncode != -13:  # -13: we stopped reading
            raise ImagePullError(f"zstd could not decompress layer {path.name}")


def _clean_name(name: str, what: str = "member") -> str:
    """Normalize a member name to a relative path; reject absolute names and ``..``."""
    if name.startswith("/"):
        raise UnsafeArchiveError(f"archive {what} {name!r} has an absolute path")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"archive {what} {name!r} contains '..'")
    return "/".join(parts)


def _ensure_parents(rootfs: Path, rel: str, *, create: bool = True) -> Path | None:
    """Return rootfs/rel after checking (and creating) its parents as real directories.

    With ``create=False`` a missing parent gives None instead.
    """
    cur = rootfs
    parts = rel.split("/")
    for part in parts[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(cur, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeArchiveError(
                f"archive member {rel!r} would be written through the symlink {part!r}"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchiveError(f"archive member {rel!r} is below the non-directory {part!r}")
    return cur / parts[-1]


def _remove(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _remove_lower(dirpath: Path, rel: str, this_layer: set[str]) -> None:
    """Opaque whiteout: delete what lower layers put below ``dirpath``, keep this layer's."""
    try:
        entries = list(os.scandir(dirpath))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        child = f"{rel}/{entry.name}" if rel else entry.name
        if child not in this_layer:
            _remove(Path(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            _remove_lower(Path(entry.path), child, this_layer)


def rootfs_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
    """Extraction filter: the stdlib's fully-trusted one, once the member passed our checks.

    The checks that need the rootfs state (parents, existing entries) run in ``apply_layer``
    just before extraction; this filter re-checks what depends only on the member.
    """
    _clean_name(member.name)
    if member.ischr() or member.isblk():
        raise UnsafeArchiveError(f"archive member {member.name!r} is a device node")
    return tarfile.fully_trusted_filter(member, dest_path)


def _apply_xattrs(member: tarfile.TarInfo, target: Path) -> None:
    for key, value in member.pax_headers.items():
        if not key.startswith("SCHILY.xattr."):
            continue
        name = key[len("SCHILY.xattr.") :]
        if not name.startswith(_ALLOWED_XATTRS):
            continue  # trusted.* (e.g. overlay markers) and others never come from an image
        raw = value.encode("utf-8", "surrogateescape")
        with contextlib.suppress(OSError):
            os.setxattr(target, name, raw, follow_symlinks=False)


def apply_layer(stream: IO[bytes], rootfs: Path, *, whiteouts: bool = True) -> int:
    """Extract one layer's tar stream onto ``rootfs``; return the bytes of regular files written.

    With ``whiteouts=False`` (a plain rootfs tarball) whiteout entries are simply skipped.
    """
    rootfs = Path(rootfs)
    dest = str(rootfs)
    this_layer: set[str] = set()
    written = 0
    try:
        tf = tarfile.open(fileobj=stream, mode="r|*")
    except tarfile.TarError as exc:
        raise ImagePullError(f"not a tar archive: {exc}") from exc
    with tf:
        try:
            for member in tf:
                written += _apply_member(tf, member, rootfs, dest, this_layer, whiteouts)
        except (tarfile.TarError, EOFError) as exc:
            raise ImagePullError(f"corrupt layer archive: {exc}") from exc
    return written


def _apply_member(
    tf: tarfile.TarFile,
    member: tarfile.TarInfo,
    rootfs: Path,
    dest: str,
    this_layer: set[str],
    whiteouts: bool,
) -> int:
    rel = _clean_name(member.name)
    if not rel:
        return 0  # the archive's own "./" entry: the rootfs directory already exists
    base = rel.rsplit("/", 1)[-1]
    parent_rel = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if base.startswith(WHITEOUT_PREFIX):
        if not whiteouts:
            return 0
        wh = _ensure_parents(rootfs, rel, create=False)
        if wh is None:
            return 0  # nothing below a directory that does not exist
        if base == OPAQUE_MARKER:
            _remove_lower(wh.parent, parent_rel, this_layer)
        elif not base.startswith(WHITEOUT_PREFIX + WHITEOUT_PREFIX):
            victim = f"{parent_rel}/{base[4:]}" if parent_rel else base[4:]
            if victim not in this_layer:
                _remove(wh.parent / base[len(WHITEOUT_PREFIX) :])
        return 0
    if member.ischr() or member.isblk():
        if rel == "dev" or rel.startswith("dev/"):
            return 0
        raise UnsafeArchiveError(f"archive member {rel!r} is a device node")
    target = _ensure_parents(rootfs, rel)
    assert target is not None
    existing = None
    with contextlib.suppress(FileNotFoundError):
        existing = os.lstat(target)
    if existing is not None and not (member.isdir() and stat.S_ISDIR(existing.st_mode)):
        _remove(target)
    this_layer.add(rel)
    if member.islnk():
        link_rel = _clean_name(member.linkname, "hard link target")
        source = _ensure_parents(rootfs, link_rel, create=False) if link_rel else rootfs
        try:
            if source is None:
                raise FileNotFoundError(link_rel)
            st = os.lstat(source)
        except FileNotFoundError:
            raise UnsafeArchiveError(
                f"hard link {rel!r} points at {member.linkname!r}, which does not exist"
            ) from None
        if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
            raise UnsafeArchiveError(f"hard link {rel!r} points at a symlink or directory")
        os.link(source, target, follow_symlinks=False)
        return 0
    member = member.replace(name=rel, deep=False)
    tf.extract(member, dest, set_attrs=True, numeric_owner=True, filter=rootfs_filter)
    _apply_xattrs(member, target)
    return member.size if member.isreg() else 0


def dir_size(path: Path) -> int:
    """Bytes used by regular files below ``path`` (hard links counted once)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += st.st_size
    return total


def strip_device_nodes(rootfs: Path) -> None:
    """Remove device nodes a build left in ``dev/`` (the runtime provides its own /dev)."""
    devdir = rootfs / "dev"
    if not devdir.is_dir() or devdir.is_symlink():
        return
    for dirpath, _dirs, files in os.walk(devdir):
        for name in files:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                os.unlink(p)
