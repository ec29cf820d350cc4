"""The execd bundle: a self-contained, read-only Python runtime mounted into every sandbox.

execd must run in any image, including ones without Python or with a different libc, so it
brings everything along: the host's CPython (the venv's base interpreter), its standard
library, the distributions execd imports, every shared library those need (found with
``ldd``) and the host's own ``ld-linux`` and libc. Inside the sandbox it is started through
that ``ld-linux`` with ``--library-path``, so nothing is looked up in the image's
/lib and nothing leaks into the environment of the commands execd runs.

Built in two cached steps under ``data_dir/execd-bundle/``: ``base-<hash>`` (interpreter,
stdlib, third-party distributions, libraries; keyed on the interpreter and distribution
versions) and ``<hash>`` (a hard-link copy of the base plus sandlot's own code; keyed on
that code too), so an edit of sandlot's code costs a link farm, not a full rebuild.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandlot.runtime import bundle_bytecode, bundle_prune

FORMAT_VERSION = "2"  # 2: modules compiled without docstrings (bundle_bytecode)
MOUNT_POINT = "/opt/sandlot"
COMPLETE = ".complete"  # a finished build's marker (hard-linked from the base into its bundles)
# A shared cache (the test suite's, the bench's) keeps a bundle served this recently: a run
# of another checkout may still have stopped sandboxes naming it (see prune_shared).
SHARED_IDLE_SECONDS = 24 * 3600.0
# Every distribution execd imports (their own requirements are added automatically).
# execd serves HTTP itself (execd/httpserver.py on h11 and websockets' sans-I/O protocol):
# no uvicorn, httptools, uvloop or click (uvicorn's CLI) in sandboxes.
EXECD_DISTRIBUTIONS = (
    "starlette", "anyio", "sniffio", "idna", "h11",
    "websockets", "python-multipart", "jupyter_client", "pyzmq", "tornado", "traitlets",
    "jupyter_core", "platformdirs", "python-dateutil", "six", "psutil",
    "typing_extensions", "wcmatch", "stringzilla",
    # the execd zygote's confinement steps (sandlot.execd.confine), host-side only
    "pyseccomp", "python-prctl",
)
# Never needed inside a sandbox; large or GUI-only parts of the standard library.
_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages",
                "dist-packages", "__phello__", "lib2to3",
                "__pycache__"}  # the host's bytecode: compiled again here, without docstrings
_DYNLOAD_SKIP = ("_tkinter", "_test", "xxlimited", "_xxtestfuzz", "_ctypes_test")
_EXTRA_LIBS = ("libgcc_s.so.1",)  # dlopen()ed by glibc for thread exit/cancellation
_PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecdBundle:
    """A built bundle on the host and how to start execd from it inside a sandbox."""

    path: Path
    mount_point: str = MOUNT_POINT

    def python_argv(self) -> list[str]:
        """argv prefix that runs the bundle's Python with the bundle's own loader and libs."""
        m = self.mount_point
        return [f"{m}/lib/ld-linux-x86-64.so.2", "--library-path", f"{m}/lib",
                f"{m}/bin/python3", "-s"]

    def env(self) -> dict[str, str]:
        m = self.mount_point
        return {"PYTHONHOME": m, "PYTHONPATH": f"{m}/site-packages",
                "PYTHONDONTWRITEBYTECODE": "1"}


def _base_executable() -> Path:
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return Path(os.path.realpath(exe))


def _req_names(dist: md.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        name_part, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name_part)
        if m:
            names.append(m.group(1))
    return names


def distribution_closure(names: tuple[str, ...] = EXECD_DISTRIBUTIONS) -> list[md.Distribution]:
    """The installed distributions ``names`` and everything they require (offline)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # e.g. a requirement whose marker excludes this platform
        seen[key] = dist
        todo.extend(_req_names(dist))
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def _sandlot_dir() -> Path:
    spec = importlib.util.find_spec("sandlot")
    assert spec and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0])


def _hash_tree(h: hashlib._Hash, root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts or not p.is_file():
            continue
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")


def base_key() -> str:
    exe = _base_executable()
    st = exe.stat()
    h = hashlib.sha256(f"{FORMAT_VERSION}|{sys.version}|{exe}|{st.st_size}|{st.st_mtime_ns}"
                       .encode())
    for d in distribution_closure():
        h.update(f"|{d.metadata['Name']}=={d.version}".encode())
    return h.hexdigest()[:16]


def full_key(base: str) -> str:
    h = hashlib.sha256(base.encode())
    _hash_tree(h, _sandlot_dir())
    return h.hexdigest()[:16]


def _ldd(path: Path) -> list[Path]:
    """Shared libraries ``path`` loads, including the dynamic loader itself."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def _is_elf_so(p: Path) -> bool:
    if not p.is_file() or p.is_symlink() or ".so" not in p.name:
        return False
    with open(p, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _copy_libs(dest_lib: Path, objects: list[Path]) -> None:
    wanted: dict[str, Path] = {}
    for obj in objects:
        for lib in _ldd(obj):
            wanted.setdefault(lib.name, lib)
    libc = next((p for n, p in wanted.items() if n == "libc.so.6"), None)
    for extra in _EXTRA_LIBS:
        if extra not in wanted and libc is not None:
            cand = libc.parent / extra
            if cand.exists():
                wanted[extra] = cand
    for name, src in wanted.items():
        target = dest_lib / name
        if not target.exists():
            shutil.copy2(os.path.realpath(src), target)


def _copy_stdlib(dest: Path) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload")
    target = dest / "lib" / _PY

    def ignore(d: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _STDLIB_SKIP or n.startswith("config-")}
        if Path(d) == stdlib:
            return skip
        skip |= {n for n in names if n == "tests"}
        if Path(d).name == "lib-dynload":
            skip |= {n for n in names if n.startswith(_DYNLOAD_SKIP)}
        return skip

    shutil.copytree(stdlib, target, ignore=ignore, symlinks=False)
    if not (target / "lib-dynload").is_dir() and dynload.is_dir():
        shutil.copytree(dynload, target / "lib-dynload")


def _copy_distribution(dist: md.Distribution, site: Path) -> None:
    base = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        src = Path(str(dist.locate_file(f)))
        try:
            rel = src.resolve().relative_to(base.resolve())
        except ValueError:
            continue  # console scripts and other files outside site-packages
        if "__pycache__" in rel.parts or not src.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _build_base(dest: Path) -> None:
    (dest / "bin").mkdir(parents=True)
    (dest / "lib").mkdir()
    site = dest / "site-packages"
    site.mkdir()
    exe = _base_executable()
    shutil.copy2(exe, dest / "bin" / "python3")
    _copy_stdlib(dest)
    for dist in distribution_closure():
        _copy_distribution(dist, site)
    objects = [exe] + [p for p in dest.rglob("*.so*") if _is_elf_so(p)]
    _copy_libs(dest / "lib", objects)
    if not (dest / "lib" / "ld-linux-x86-64.so.2").exists():
        raise RuntimeError("the host's dynamic loader was not found by ldd")
    bundle_bytecode.compile_tree(dest)


def _link_farm(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, copy_function=os.link)


def _build_full(base: Path, dest: Path) -> None:
    _link_farm(base, dest)
    code = dest / "site-packages" / "sandlot"
    shutil.copytree(_sandlot_dir(), code, ignore=shutil.ignore_patterns("__pycache__"))
    bundle_bytecode.compile_tree(code)


@contextlib.contextmanager
def _locked(cache_root: Path) -> Iterator[None]:
    """The cache's lock: one build or prune at a time, across processes."""
    with open(cache_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build_once(root: Path, name: str, build) -> Path:  # type: ignore[no-untyped-def]
    final = root / name
    if (final / COMPLETE).exists():
        return final
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    try:
        build(tmp)
        (tmp / COMPLETE).write_text("")
        if final.exists():  # an incomplete leftover of a crashed build
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_bundle(cache_root: Path,
                  referenced: Callable[[], Iterable[Path]] | None = None) -> ExecdBundle:
    """Return the current bundle, building it first if sandlot's code or deps changed.

    With ``referenced`` (a runtime serving from its own data dir's cache: the bundles its
    sandboxes name), the bundles of earlier versions nothing uses are removed after
    (``bundle_prune``); a failure there is logged and does not stop the start."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with _locked(cache_root):
        bkey = base_key()
        base = _build_once(cache_root, f"base-{bkey}", _build_base)
        full = _build_once(cache_root, full_key(bkey), lambda d: _build_full(base, d))
        # When each was last served (see prune_shared): the folder's own time, since its
        # files are hard links that every bundle of one base shares.
        for served in (base, full):
            with contextlib.suppress(OSError):
                os.utime(served)
        for tmp in cache_root.glob(".tmp-*"):  # crashed builds and prunes of earlier runs
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
        if referenced is not None:
            try:
                bundle_prune.prune_unused(cache_root, (base, full), referenced)
            except Exception:  # noqa: BLE001 - a cache left as it was must not stop a start
                log.warning("execd bundles of earlier versions were not pruned", exc_info=True)
    return ExecdBundle(full)


def prune_shared(cache_root: Path, idle_seconds: float = SHARED_IDLE_SECONDS) -> list[Path]:
    """Remove the bundles of a cache that several short-lived data dirs share (the test
    suite's, the bench's; ``ensure_bundle`` leaves a linked cache alone) when no runtime has
    served them for ``idle_seconds`` and nothing on the host uses them; the current code's
    bundle and base are kept. Only for caches whose data dirs are all temporary: a stopped
    sandbox there lives no longer than the run that made it, which the idle time covers.
    Not as root, it removes nothing (``bundle_prune.used_on_host``). The removed paths."""
    cache_root = cache_root.resolve()
    if not cache_root.is_dir():
        return []
    with _locked(cache_root):
        bkey = base_key()
        now = time.time()
        recent = [folder for folder in cache_root.iterdir()
                  if _served_within(folder, now - idle_seconds)]
        current = (cache_root / f"base-{bkey}", cache_root / full_key(bkey))
        return bundle_prune.prune_unused(cache_root, (*current, *recent), lambda: ())


def _served_within(folder: Path, since: float) -> bool:
    try:
        return folder.stat().st_mtime >= since
    except OSError:
        return False
