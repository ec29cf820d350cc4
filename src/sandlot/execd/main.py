"""``sandlot execd`` / ``python -m sandlot.execd``: parse options, scrub the environment,
listen, start the user's entrypoint, and stay a good PID 1 (reap, kill children on SIGTERM).

Start-up is kept lean (this module imports only the standard library at import time) so
``/ping`` answers quickly after the sandbox starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Sequence
from typing import Any

from sandlot.execd import protocol

PRIVATE_ENV = "SANDLOT_EXECD_PRIVATE_ENV"
TOKEN_ENV = "SANDLOT_EXECD_TOKEN"
DEFAULT_PORT = protocol.DEFAULT_PORT
KEEP_ALIVE_SECONDS = 75.0  # see --keep-alive-timeout
# Slow clients (sandlot.http_deadlines): the request head within 30 s, body pauses <= 60 s
# (generous: execd may run throttled to a fraction of a CPU; the host listener in front of
# it closes connections idle for endpoint_idle_timeout_seconds anyway).
HEADER_TIMEOUT = 30.0
BODY_IDLE_TIMEOUT = 60.0


def scrub_environment(environ: Any = None) -> str | None:
    """Remove execd's private variables from the environment; returns the token if any."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV) or None
    names = [n.strip() for n in env.get(PRIVATE_ENV, "").split(",") if n.strip()]
    for name in [*names, TOKEN_ENV, PRIVATE_ENV]:
        env.pop(name, None)
    return token


def read_token_from_stdin() -> str | None:
    """The token the runtime wrote into our stdin pipe; stdin is /dev/null afterwards."""
    chunks = []
    while chunk := os.read(0, 4096):
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return b"".join(chunks).decode().strip() or None


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    args = list(argv)
    entrypoint: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, entrypoint = args[:cut], args[cut + 1 :]
    ns = parser().parse_args(args)
    return ns, entrypoint


@functools.cache
def parser() -> argparse.ArgumentParser:
    """execd's options; built once (the execd zygote builds it before forking, so forked
    execds share it instead of each building and writing its own)."""
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
    parser.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the access token from stdin (up to EOF); keeps it out of /proc/1/environ",
    )
    parser.add_argument("--workdir", default=None, help="default cwd of commands")
    parser.add_argument(
        "--user", default=None, metavar="UID:GID",
        help="default user of the entrypoint and of commands that name none (image User)",
    )
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
        "--handoff",
        action="store_true",
        help="also serve client connections the host hands over as descriptors on the "
             "network namespace's abstract socket @sandlot-execd-handoff (execd/handoff.py)",
    )
    parser.add_argument(
        "--pooled",
        action="store_true",
        help="a warm-pool execd: serve POST /_sandlot/claim once; the entrypoint comes with it",
    )
    parser.add_argument(
        "--keep-alive-timeout", type=float, default=KEEP_ALIVE_SECONDS,
        help="seconds an idle HTTP connection is kept before execd closes it: longer than "
             "clients keep idle connections for reuse (the released SDKs 30 s, the server "
             "proxy 20 s), or a request sent as execd closes fails (under gVisor the host sets "
             "it longer: the closing side keeps TIME_WAIT, which blocks hibernation)",
    )
    parser.add_argument(
        "--interrupt-grace", type=float, default=3.0, help="seconds between SIGINT/SIGTERM/SIGKILL"
    )
    return parser


BIND_RETRY_SECONDS = 3.0
BIND_RETRY_STEP = 0.02


def _bind_when_free(sock: socket.socket, address: tuple[str, int]) -> None:
    """``bind``, retried while the port is briefly taken.

    A host polling the port before execd binds it can self-connect onto it for a moment
    (the host closes such a socket at once; see runtime/tcp_connect.py), and a host-mode
    port is picked free but can be caught by another socket in between. A port still taken
    after ``BIND_RETRY_SECONDS`` is a real conflict: the error goes out.
    """
    deadline = time.monotonic() + BIND_RETRY_SECONDS
    while True:
        try:
            sock.bind(address)
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                sock.close()
                raise
        time.sleep(BIND_RETRY_STEP)


def make_socket(addr: str) -> socket.socket:
    """A bound, listening socket for ``unix:/path`` or ``tcp:HOST:PORT``."""
    kind, _, rest = addr.partition(":")
    if kind == "unix" and rest:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(rest).st_mode):
                os.unlink(rest)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # rw for owner and group (0660) through the umask: under gVisor the socket is a host
        # socket made by the gofer (runsc --host-uds=create), which refuses a later chmod.
        old_umask = os.umask(0o117)
        try:
            sock.bind(rest)
        finally:
            os.umask(old_umask)
    elif kind == "tcp" and rest:
        host, _, port = rest.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _bind_when_free(sock, (host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        raise SystemExit(f"execd: bad --listen address {addr!r} (use unix:/path or tcp:HOST:PORT)")
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    ns, entrypoint = parse_args(sys.argv[1:] if argv is None else argv)
    from sandlot.execd import procs

    procs.become_undumpable()
    token = read_token_from_stdin() if ns.token_stdin else None
    token = token or ns.token or scrub_environment()
    scrub_environment()
    ns.listen = ns.listen or [f"tcp:0.0.0.0:{DEFAULT_PORT}"]
    sockets = [make_socket(a) for a in ns.listen]
    handoff = None
    if ns.handoff:  # bound with the listeners: what arrives before the loop runs waits
        from sandlot.execd.handoff import bind_receiver

        try:
            handoff = bind_receiver()
        except OSError as exc:  # the host then relays this sandbox's connections instead
            print(f"execd: no hand-over socket ({exc}); connections come relayed",
                  file=sys.stderr)
    # Plain asyncio loop on purpose: uvloop reserves SIGCHLD, which execd needs to reap
    # every child (it is often PID 1).
    return asyncio.run(_serve(ns, token, sockets, entrypoint, handoff))


async def _serve(
    ns: argparse.Namespace, token: str | None, sockets: list[socket.socket], entrypoint: list[str],
    handoff: socket.socket | None = None,
) -> int:
    from sandlot.execd import procs
    from sandlot.execd.app import build_app
    from sandlot.execd.settings import Settings, default_workdir

    uid, _, gid = (ns.user or "").partition(":")
    settings = Settings(
        token=token,
        default_uid=int(uid) if uid else None,
        default_gid=int(gid or 0) if uid else None,
        workdir=ns.workdir or default_workdir(),
        state_dir=ns.state_dir,
        # Beside the entrypoint's log, where every backend puts it; the server's diagnostics
        # read it at the same fixed path.
        kernel_log=protocol.KERNEL_LOG if ns.entrypoint_log else None,
        interrupt_grace=ns.interrupt_grace,
        keepalive_interval=ns.keepalive,
    )
    _raise_fd_limit()
    procs.become_subreaper()
    procs.REAPER.install()
    extensions: list[Any] = []
    code = None
    if not ns.no_code:
        from sandlot.execd.lazyext import DeferredCode, wanted_at_start

        code = DeferredCode(settings)
        extensions.append(code)
    if ns.pooled:
        from sandlot.execd.claim import ClaimExtension

        def on_claim(argv: list[str]) -> None:
            if argv:
                loop.create_task(_start_entrypoint(server, argv, ns.entrypoint_log, settings))
            if code is not None and wanted_at_start(os.environ):
                code.start_loading()  # now that the sandbox's environment is in place

        extensions.append(ClaimExtension(settings, on_claim))
    app = build_app(settings, extensions=extensions)
    from sandlot.execd.httpserver import HttpServer

    _configure_logging(ns.log_level)
    server = HttpServer(
        app,
        header_timeout=HEADER_TIMEOUT,
        body_idle_timeout=BODY_IDLE_TIMEOUT,
        keep_alive_timeout=ns.keep_alive_timeout,
        shutdown_grace=1.0,
        ws_ping_interval=30.0,
    )
    loop = asyncio.get_running_loop()

    def on_term(sig: int) -> None:
        procs.REAPER.kill_all(signal.SIGKILL)
        server.request_exit()  # graceful: lifespan shutdown cleans sessions and journals

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, on_term, sig)
    from sandlot.execd.hibernation import Hibernation

    Hibernation(server, list(ns.listen), make_socket).install(loop)

    if entrypoint and not ns.pooled:
        loop.create_task(_start_entrypoint(server, entrypoint, ns.entrypoint_log, settings))
    if code is not None and not ns.pooled and wanted_at_start(os.environ):
        loop.create_task(_after_start(server, code.start_loading))
    unix_paths = [s.getsockname() for s in sockets if s.family == socket.AF_UNIX]
    receiver = None
    if handoff is not None:
        from sandlot.execd.handoff import HandoffReceiver

        receiver = HandoffReceiver(handoff, server.adopt)
        loop.create_task(_after_start(server, receiver.start))
    try:
        await server.serve(sockets=sockets)
    finally:
        if receiver is not None:
            receiver.close()
        procs.REAPER.kill_all(signal.SIGKILL)
        procs.REAPER.reap()
        for path in unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


def _configure_logging(level: str) -> None:
    """One stderr handler for execd's loggers: execd's log is the container's stderr,
    capped below."""
    import logging

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.WARNING),
        format="execd %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(LogCap())


class LogCap:
    """Stops execd's own log (the host-side container.log) at a cap: requests from the
    workload that make execd log must not fill the host's disk.

    Counts what is written: the message with its arguments (which may carry anything a
    request sent, a path or a command) and any traceback, not the format string alone.
    """

    def __init__(self, max_bytes: int = 4 << 20) -> None:
        self.left = max_bytes

    def filter(self, record: Any) -> bool:
        import logging

        if self.left <= 0:
            return False
        try:
            size = len(record.getMessage()) + 100
        except Exception:  # noqa: BLE001 - a bad format: logging reports it; count the template
            size = len(str(record.msg)) + 100
        if record.exc_info:
            size += len(logging.Formatter().formatException(record.exc_info))
        self.left -= size
        if self.left <= 0:  # this record would cross the cap: say so instead
            record.msg, record.args = "log cap reached: execd logs nothing more", ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def _raise_fd_limit() -> None:
    """Many concurrent commands each hold pipes; allow as many descriptors as permitted."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _after_start(server: Any, then: Any) -> None:
    """Run ``then()`` once the server listens (heavy work must not delay the first /ping)."""
    await server.started.wait()
    then()


async def _start_entrypoint(
    server: Any, argv: list[str], log_path: str | None, settings: Any
) -> None:
    from sandlot.execd import procs
    from sandlot.execd.cappedlog import CappedLog, copy_pipe_into

    await server.started.wait()
    if not log_path:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            procs.spawn(argv, cwd=settings.workdir, env=dict(os.environ), stdout=null,
                        stderr=null, uid=settings.default_uid, gid=settings.default_gid)
        except OSError:
            pass
        finally:
            os.close(null)
        return
    # Through a pipe into a capped, rotated log: the workload cannot grow it without bound.
    log = CappedLog(log_path)
    read_end, out = os.pipe2(os.O_CLOEXEC)
    try:
        pid, _exit = procs.spawn(argv, cwd=settings.workdir, env=dict(os.environ), stdout=out,
                                 stderr=out, uid=settings.default_uid, gid=settings.default_gid)
        status = procs.REAPER.watch_status(pid)
    except OSError as exc:
        log.write(f"execd: cannot start entrypoint {argv[0]}: {exc}\n".encode())
        status = None
    finally:
        os.close(out)
    drained = copy_pipe_into(read_end, log)
    if status is not None:
        # The server's diagnostics read this last line (sandlot.execd.protocol).
        await asyncio.wait({status})
        with contextlib.suppress(TimeoutError):  # output still in the pipe comes first
            await asyncio.wait_for(asyncio.shield(drained), 2.0)
        line = protocol.entrypoint_exit_line(status.result())
        with contextlib.suppress(OSError):
            ending = CappedLog(log_path)
            ending.write(line.encode())
            ending.close()

