"""The stand-ins of ``sandlot.execd.lazyimports`` (ssl, hashlib, hmac, http.client,
logging.config): start-up
imports without the real modules, the real ones on first use, an idle execd without OpenSSL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import connect

from sandlot.execd import lazyimports
from tests.execd.conftest import start_execd, stop_execd


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter after ``lazyimports.install()``."""
    prelude = (
        "from sandlot.execd import lazyimports\n"
        "assert lazyimports.install() == "
        "['ssl', 'hashlib', 'hmac', 'http.client', 'logging.config']\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_execd_start_up_imports_need_no_openssl() -> None:
    out = run_python(
        """
        import sys
        import asyncio, asyncio.sslproto, secrets, hmac
        import uvicorn.config, starlette.applications, starlette.responses
        import anyio._backends._asyncio
        from sandlot.execd import lazyimports, main
        loaded = [m for m in ("_ssl", "_hashlib", "email.parser") if m in sys.modules]
        assert not loaded, loaded
        names = ("ssl", "hashlib", "hmac", "http.client", "logging.config")
        assert all(lazyimports.is_stand_in(sys.modules[n]) for n in names)
        import logging
        assert logging.config is sys.modules["logging.config"]
        assert logging.config.dictConfig is not None  # first real use imports it
        assert not lazyimports.is_stand_in(sys.modules["logging.config"])
        from starlette.exceptions import HTTPException
        assert HTTPException(404).detail == "Not Found" and "email.parser" not in sys.modules
        assert hmac.compare_digest(b"token", b"token") and not hmac.compare_digest(b"a", b"b")
        assert len(secrets.token_hex(8)) == 16
        # nothing is an instance of a stand-in class; probes of dunders do not load
        assert not isinstance(object(), sys.modules["ssl"].SSLSocket)
        assert getattr(sys.modules["ssl"], "__file__", None) is None
        assert "_ssl" not in sys.modules and lazyimports.is_stand_in(sys.modules["ssl"])
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_first_real_use_imports_ssl_and_fixes_what_bound_the_stand_in() -> None:
    out = run_python(
        """
        import sys
        import asyncio.sslproto, uvicorn.config
        import anyio.streams.tls
        stand_in = sys.modules["ssl"]
        constants = {k: stand_in.__dict__[k] for k in ("PROTOCOL_TLS_SERVER", "CERT_NONE")}
        ctx = uvicorn.config.ssl.create_default_context()  # through a module that bound it
        import ssl
        assert ssl is not stand_in and sys.modules["ssl"] is ssl and "_ssl" in sys.modules
        assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED
        assert uvicorn.config.ssl.SSLContext is ssl.SSLContext  # the stand-in mirrors it now
        assert asyncio.sslproto.SSLAgainErrors == (ssl.SSLWantReadError, ssl.SSLSyscallError)
        assert anyio.streams.tls.SSLContext is ssl.SSLContext
        assert constants == {"PROTOCOL_TLS_SERVER": ssl.PROTOCOL_TLS_SERVER,
                             "CERT_NONE": ssl.CERT_NONE}
        from sandlot.execd import lazyimports
        assert not lazyimports.is_stand_in(stand_in)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_hashlib_and_hmac_load_on_use() -> None:
    out = run_python(
        """
        import hashlib as early_hashlib, hmac as early_hmac
        import starlette.responses
        assert starlette.responses.hashlib.md5(b"abc").hexdigest() == (
            "900150983cd24fb0d6963f7d28e17f72")
        sig = early_hmac.new(b"key", b"msg", "sha256").hexdigest()
        import hashlib, hmac, sys
        assert sig == hmac.new(b"key", b"msg", hashlib.sha256).hexdigest()
        assert early_hashlib.sha256 is hashlib.sha256
        assert "_hashlib" in sys.modules
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_http_client_loads_on_use() -> None:
    out = run_python(
        """
        import sys
        import starlette.exceptions
        stand_in = sys.modules["http.client"]
        assert starlette.exceptions.http.client is stand_in
        conn = stand_in.HTTPConnection("localhost", 1)
        import http.client
        assert http.client is not stand_in and isinstance(conn, http.client.HTTPConnection)
        assert starlette.exceptions.http.client is http.client and "email.parser" in sys.modules
        assert stand_in.responses == http.client.responses
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_ssl_loads_from_a_thread_as_the_code_service_does() -> None:
    out = run_python(
        """
        import sys, threading
        import asyncio
        results = []
        def use():
            import ssl
            results.append(ssl.create_default_context().check_hostname)
        threads = [threading.Thread(target=use) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        import ssl
        assert results == [True] * 4 and ssl.SSLContext.__module__ == "ssl"
        print("ok")
        """
    )
    assert out.strip() == "ok"


@pytest.fixture
def fake_module(tmp_path: Path) -> Iterator[str]:
    name = "sandlot_lazyimports_fake"
    (tmp_path / f"{name}.py").write_text("VALUE = 3\nclass Boom(Exception):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_stand_in_mirrors_the_real_module_and_repoints_bound_classes(fake_module: str) -> None:
    boom = lazyimports._stand_in_class("Boom", Exception)
    assert lazyimports.install({fake_module: lambda: {"Boom": boom}}) == [fake_module]
    assert lazyimports.install({fake_module: dict}) == []  # already there: left alone
    stand_in = sys.modules[fake_module]
    catch = (boom, KeyError)  # as ``except (mod.Boom, KeyError)`` tuples are kept
    holder = type(sys)("sandlot_lazyimports_holder")
    holder.__dict__.update(Boom=boom, catch=catch)
    sys.modules[holder.__name__] = holder
    try:
        assert stand_in.Boom is boom and lazyimports.is_stand_in(stand_in)
        assert stand_in.VALUE == 3  # not preset: imports the real module
        real = sys.modules[fake_module]
        assert real is not stand_in and not lazyimports.is_stand_in(stand_in)
        assert stand_in.Boom is real.Boom and holder.Boom is real.Boom
        assert holder.catch == (real.Boom, KeyError)
        with pytest.raises(AttributeError):
            _ = stand_in.missing
    finally:
        del sys.modules[holder.__name__]


def test_a_failed_import_keeps_the_stand_in() -> None:
    name = "sandlot_lazyimports_missing_module"
    lazyimports.install({name: dict})
    try:
        stand_in = sys.modules[name]
        with pytest.raises(ModuleNotFoundError):
            _ = stand_in.anything
        assert sys.modules[name] is stand_in and lazyimports.is_stand_in(stand_in)
    finally:
        sys.modules.pop(name, None)


def _mapped(pid: int | str) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_idle_execd_has_not_loaded_openssl_or_websockets(tmp_path: Path) -> None:
    """OpenSSL (via _ssl/_hashlib) waits for a real use, websockets for the first upgrade."""
    import ssl  # noqa: F401 - this process shows what a loaded _ssl looks like in maps

    assert "/_ssl." in _mapped("self")
    ex = start_execd(tmp_path)
    try:
        with ex.client() as c:
            r = c.post("/command", json={"command": "echo hi"})
            assert r.status_code == 200 and "execution_complete" in r.text
            assert c.get("/metrics").status_code == 200
            maps = _mapped(ex.proc.pid)
            for library in ("/_ssl.", "/_hashlib.", "libssl", "libcrypto", "/websockets/"):
                assert library not in maps, library
            # The first WebSocket upgrade imports the protocol; the PTY attach works.
            sid = c.post("/pty", json={"command": "echo attached; sleep 30"}).json()["session_id"]
            try:
                url = f"ws://{ex.endpoint}/pty/{sid}/ws?since=0"
                with connect(url, additional_headers=ex.headers) as ws:
                    text = b""
                    while b"attached" not in text:
                        frame = ws.recv(timeout=10)
                        if isinstance(frame, bytes):  # replay / output frames
                            text += frame
            finally:
                c.delete(f"/pty/{sid}")
            assert "/websockets/" in _mapped(ex.proc.pid)
    finally:
        stop_execd(ex)
