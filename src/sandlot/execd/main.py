"""``sandlot execd`` / ``python -m sandlot.execd``: parse options, scrub the environment,
listen, start the user's entrypoint, and stay a good PID 1 (reap, kill children on SIGTERM).

Start-up is kept lean (this module imports only the standard library at import time) so
``/ping`` answers quickly after the sandbox starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import stat
import sys
from collections.abc import Sequence
from typing import Any

PRIVATE_ENV = "SANDLOT_EXECD_PRIVATE_ENV"
TOKEN_ENV = "SANDLOT_EXECD_TOKEN"
DEFAULT_PORT = 44772


def scrub_environment(environ: Any = None) -> str | None:
    """Remove execd's private variables from the environment; returns the token if any."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV) or None
    names = [n.strip() for n in env.get(PRIVATE_ENV, "").split(",") if n.strip()]
    for name in [*names, TOKEN_ENV, PRIVATE_ENV]:
        env.pop(name, None)
    return token


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    args = list(argv)
    entrypoint: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, entrypoint = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="sandlot execd",
        description="In-sandbox execution daemon serving the OpenSandbox execd API.",
        epilog="Anything after `--` is the sandbox entrypoint, started once execd listens.",
    )
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="unix:/path/to.sock or tcp:HOST:PORT (repeatable; default tcp:0.0.0.0:44772)",
    )
    parser.add_argument("--token", default=None, help="access token (or env SANDLOT_EXECD_TOKEN)")
    parser.add_argument("--workdir", default=None, help="default cwd of commands")
    parser.add_argument("--entrypoint-log", default=None, help="file for the entrypoint's output")
    parser.add_argument("--state-dir", default=None, help="where execution journals are kept")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--keepalive", type=float, default=15.0, help="seconds of silence before an SSE comment"
    )
    parser.add_argument(
        "--no-code", action="store_true", help="do not load the code-context (/code) service"
    )
    parser.add_argument(
        "--interrupt-grace", type=float, default=3.0, help="seconds between SIGINT/SIGTERM/SIGKILL"
    )
    ns = parser.parse_args(args)
    return ns, entrypoint


def make_socket(addr: str) -> socket.socket:
    """A bound, listening socket for ``unix:/path`` or ``tcp:HOST:PORT``."""
    kind, _, rest = addr.partition(":")
    if kind == "unix" and rest:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(rest).st_mode):
                os.unlink(rest)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(rest)
        os.chmod(rest, 0o660)
    elif kind == "tcp" and rest:
        host, _, port = rest.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        raise SystemExit(f"execd: bad --listen address {addr!r} (use unix:/path or tcp:HOST:PORT)")
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    ns, entrypoint = parse_args(sys.argv[1:] if argv is None else argv)
    token = ns.token or scrub_environment()
    scrub_environment()
    sockets = [make_socket(a) for a in (ns.listen or [f"tcp:0.0.0.0:{DEFAULT_PORT}"])]
    # Plain asyncio loop on purpose: uvloop reserves SIGCHLD, which execd needs to reap
    # every child (it is often PID 1).
    return asyncio.run(_serve(ns, token, sockets, entrypoint))


async def _serve(
    ns: argparse.Namespace, token: str | None, sockets: list[socket.socket], entrypoint: list[str]
) -> int:
    import uvicorn

    from sandlot.execd import procs
    from sandlot.execd.app import build_app
    from sandlot.execd.settings import Settings, default_workdir

    settings = Settings(
        token=token,
        workdir=ns.workdir or default_workdir(),
        state_dir=ns.state_dir,
        interrupt_grace=ns.interrupt_grace,
        keepalive_interval=ns.keepalive,
    )
    _raise_fd_limit()
    procs.become_subreaper()
    procs.REAPER.install()
    extensions = [] if ns.no_code else _load_extensions(settings)
    app = build_app(settings, extensions=extensions)
    config = uvicorn.Config(
        app,
        log_level=ns.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
        ws_ping_interval=30,
        server_header=False,
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()

    def on_term(sig: int) -> None:
        procs.REAPER.kill_all(signal.SIGKILL)
        server.should_exit = True  # graceful: lifespan shutdown cleans sessions and journals

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, on_term, sig)

    if entrypoint:
        asyncio.get_running_loop().create_task(
            _start_entrypoint(server, entrypoint, ns.entrypoint_log, settings)
        )
    unix_paths = [s.getsockname() for s in sockets if s.family == socket.AF_UNIX]
    try:
        await server.serve(sockets=sockets)
    finally:
        procs.REAPER.kill_all(signal.SIGKILL)
        procs.REAPER.reap()
        for path in unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


def _raise_fd_limit() -> None:
    """Many concurrent commands each hold pipes; allow as many descriptors as permitted."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _load_extensions(settings: Any) -> list[Any]:
    """The code-context service, when its package provides ``build_extension(settings)``."""
    try:
        from sandlot.execd import code
    except ImportError:
        return []
    factory = getattr(code, "build_extension", None)
    if factory is None:
        return []
    ext = factory(settings)
    return [ext] if ext is not None else []


async def _start_entrypoint(
    server: Any, argv: list[str], log_path: str | None, settings: Any
) -> None:
    from sandlot.execd import procs

    while not server.started:
        await asyncio.sleep(0.005)
    out = os.open(
        log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
    )
    try:
        procs.spawn(argv, cwd=settings.workdir, env=dict(os.environ), stdout=out, stderr=out)
    except OSError as exc:
        os.write(out, f"execd: cannot start entrypoint {argv[0]}: {exc}\n".encode())
    finally:
        os.close(out)


class _Server:
    """uvicorn.Server without its own signal handling (execd handles signals as PID 1)."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # type: ignore[no-untyped-def]
                yield

        return Server(config)
