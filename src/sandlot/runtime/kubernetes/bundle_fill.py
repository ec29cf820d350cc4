"""Fill and check a node's execd bundle cache (``[kubernetes] execd_delivery = "node-cache"``).

Standard library only: the init container runs this file's source with the bundle image's
own interpreter (``python -c``). An entry ``<cache>/<name>`` (the name is the server's, one
per bundle image) is only ever made by a rename of a fully copied, verified, read-only
temporary directory, so a Pod never sees a half-filled entry; an entry whose content does not
hash the same as the image's bundle (damaged, tampered, made by hand, of another build) is
moved aside and filled again. The image is the reference: the server's own bundle may be
another build of the same code (compiled bytecode differs), so it never supplies the digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import uuid


def tree_digest(top: str) -> str:
    """sha256 over the tree's relative paths, file modes (without write bits: a cache
    entry is made read-only), contents and link targets."""
    h = hashlib.sha256()
    for here, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(here, name)
            st = os.lstat(path)
            h.update(os.path.relpath(path, top).encode() + b"\0")
            h.update(b"%o\0" % (stat.S_IMODE(st.st_mode) & ~0o222))
            if stat.S_ISLNK(st.st_mode):
                h.update(b"L" + os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def _writable(top: str) -> None:
    """Undo ``_read_only`` so a rejected tree can be removed."""
    for here, dirs, _ in os.walk(top):
        os.chmod(here, 0o755)
        for name in dirs:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)


def _remove(top: str) -> None:
    if os.path.lexists(top):
        _writable(top)
        shutil.rmtree(top, ignore_errors=True)


def _read_only(top: str) -> None:
    """No write bit anywhere (the sandbox mount is read-only too; this guards the node)."""
    for here, _, files in os.walk(top, topdown=False):
        for name in files:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                os.chmod(path, mode & ~0o222)
        os.chmod(here, 0o555)


def fill(source: str, cache: str, name: str) -> str:
    """Make sure ``cache/name`` holds a verified copy of ``source``; what was done."""
    digest = tree_digest(source)
    entry = os.path.join(cache, name)
    if os.path.isdir(entry) and not os.path.islink(entry):
        if tree_digest(entry) == digest:
            return "verified"
        aside = os.path.join(cache, f".rejected-{uuid.uuid4().hex}")
        os.rename(entry, aside)
        _remove(aside)
    elif os.path.lexists(entry):
        os.unlink(entry)  # a file or link where the entry belongs: never followed
    temp = os.path.join(cache, f".filling-{uuid.uuid4().hex}")
    try:
        shutil.copytree(source, temp, symlinks=True)
        _read_only(temp)
        got = tree_digest(temp)
        if got != digest:
            raise SystemExit(f"the copy of the bundle hashes to {got}, the image's to {digest}")
        try:
            os.rename(temp, entry)
        except OSError:  # another Pod's init container renamed its copy first
            if tree_digest(entry) != digest:
                raise
            return "verified"
    finally:
        _remove(temp)
    return "filled"


if __name__ == "__main__":
    print(fill(sys.argv[1], sys.argv[2], sys.argv[3]), flush=True)
