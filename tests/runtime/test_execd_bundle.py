"""The execd bundle: self-contained (own loader, libc, Python), cached, rebuilt on change."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sandlot.runtime import execd_bundle as eb
from sandlot.runtime.oci import OciRuntime


def _run_bundle_python(bundle: eb.ExecdBundle, code: str) -> subprocess.CompletedProcess[str]:
    """Run the bundle's Python on the host as it runs in a sandbox (paths rebased)."""
    root = str(bundle.path)
    argv = [a.replace(bundle.mount_point, root) for a in bundle.python_argv()]
    env = {k: v.replace(bundle.mount_point, root) for k, v in bundle.env().items()}
    return subprocess.run([*argv, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_bundle_contents(oci_runtime: OciRuntime) -> None:
    b = oci_runtime.bundle
    lib = b.path / "lib"
    for name in ("ld-linux-x86-64.so.2", "libc.so.6", "libgcc_s.so.1"):
        assert (lib / name).is_file(), name
    assert (b.path / "bin" / "python3").is_file()
    assert (b.path / "site-packages" / "sandlot" / "execd" / "__main__.py").is_file()
    stdlib = lib / eb._PY
    assert (stdlib / "asyncio").is_dir()
    for skipped in ("test", "idlelib", "tkinter", "ensurepip"):
        assert not (stdlib / skipped).exists(), skipped
    assert not any(p.name.startswith("_tkinter") for p in (stdlib / "lib-dynload").iterdir())


def test_bundle_python_loads_only_bundle_libraries(oci_runtime: OciRuntime) -> None:
    b = oci_runtime.bundle
    code = (
        "import sandlot.execd.app, sandlot.execd.httpserver, sandlot.execd.code, zmq, psutil\n"
        "import jupyter_client, websockets.server, prctl, stringzilla\n"
        "import sys, ssl, ctypes, sqlite3\n"
        "libs = {l.split()[-1] for l in open('/proc/self/maps') if '.so' in l}\n"
        "print(sys.prefix)\n"
        "print('\\n'.join(sorted(libs)))\n"
    )
    r = _run_bundle_python(b, code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(b.path)
    # The kernel names mapped files by their real path (the bundle dir may be a symlink
    # to a shared cache, as in the test fixtures).
    real = str(b.path.resolve())
    outside = [ln for ln in lines[1:] if not ln.startswith((str(b.path), real))]
    assert outside == []
    assert any(ln.endswith("/lib/libc.so.6") for ln in lines[1:])


def test_bundle_execd_scans_output_with_simd(oci_runtime: OciRuntime) -> None:
    """The bundle ships StringZilla, so execd's encoder takes its SIMD scans, not the
    fallback (which gives the same events at a third of the speed)."""
    code = (
        "from sandlot.execd import bytescan, sse\n"
        "assert bytescan.simd() is not None\n"
        "print(sse.encode_region('stdout', b'a\\tb\\n\\n'))\n"
    )
    r = _run_bundle_python(oci_runtime.bundle, code)
    assert r.returncode == 0, r.stderr
    assert '"text":"a\\\\tb"' in r.stdout and '"text":"\\\\n"' in r.stdout


def test_bundle_is_cached_and_keyed_on_code(oci_runtime: OciRuntime, tmp_path: Path) -> None:
    root = oci_runtime.bundle.path.parent
    again = eb.ensure_bundle(root)
    assert again.path == oci_runtime.bundle.path
    assert again.path.name == eb.full_key(eb.base_key())
    # the key follows file contents
    (tmp_path / "m.py").write_text("a = 1\n")
    h1 = hashlib.sha256()
    eb._hash_tree(h1, tmp_path)
    (tmp_path / "m.py").write_text("a = 2\n")
    h2 = hashlib.sha256()
    eb._hash_tree(h2, tmp_path)
    assert h1.hexdigest() != h2.hexdigest()
    # the code part is a hard-link copy of the base: an edit of sandlot does not copy Python
    base = root / f"base-{eb.base_key()}"
    exe = "bin/python3"
    assert os.stat(base / exe).st_ino == os.stat(again.path / exe).st_ino


def test_distribution_closure_follows_requirements() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in eb.distribution_closure()}
    for needed in ("starlette", "anyio", "h11", "websockets", "jupyter-client", "pyzmq",
                   "psutil", "traitlets", "python-dateutil", "six"):
        assert needed in names, needed
    # execd serves HTTP itself: the server's ASGI stack stays out of sandboxes.
    for absent in ("pytest", "uvicorn", "uvloop", "httptools", "click"):
        assert absent not in names, absent


def test_bundle_has_no_server_http_stack(oci_runtime: OciRuntime) -> None:
    """execd and the zygote import nothing of uvicorn: the bundle does not ship it."""
    site = oci_runtime.bundle.path / "site-packages"
    assert (site / "h11").is_dir()
    for absent in ("uvicorn", "uvloop", "httptools", "click"):
        assert not (site / absent).exists(), absent
    r = _run_bundle_python(oci_runtime.bundle, "import uvicorn")
    assert r.returncode != 0 and "uvicorn" in r.stderr


def test_bundle_modules_run_from_bytecode_without_docstrings(oci_runtime: OciRuntime) -> None:
    """The stdlib, the distributions and sandlot's own code come from the bundle's .pyc
    files, compiled without docstrings (bundle_bytecode); asserts stay (no -O)."""
    code = (
        "import sys, asyncio, starlette.routing, sandlot.execd.zygote as z\n"
        "print(sys.flags.optimize, asyncio.__doc__, starlette.routing.Route.__doc__,"
        " z.__doc__, z.preload.__doc__)\n"
        "print(z.__cached__, asyncio.__cached__)\n"
    )
    r = _run_bundle_python(oci_runtime.bundle, code)
    assert r.returncode == 0, r.stderr
    flags, cached = r.stdout.splitlines()
    assert flags == "0 None None None None"
    root = str(oci_runtime.bundle.path)
    tag = f".{sys.implementation.cache_tag}.pyc"  # the bundle's interpreter is the venv's
    assert all(p.startswith(root) and p.endswith(tag) for p in cached.split())
