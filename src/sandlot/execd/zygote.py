"""``python -m sandlot.execd.zygote``: execd imported once, forked into each new sandbox.

Started by the server (``runtime/oci/zygote.py``) as the bundle's interpreter in a private
mount namespace where the bundle is at ``/opt/sandlot``, so every path it imported from is
the path inside a sandbox. It imports execd and its libraries, freezes the garbage
collector (the imported objects' pages then stay shared copy-on-write with every sandbox's
execd) and waits on the descriptor named by its argument, a ``SOCK_SEQPACKET`` socket to
the server. On request it forks the zygote of code images, which also imports the code
service (``CODE_PRELOAD``, ``Zygote.spawn_code_zygote``) and then serves launches the same
way on a socket of its own. It is single-threaded: forking a threaded
process is unsafe.

A request is a small JSON header and descriptors, in this order: the plan (a pipe holding
the JSON ``{"process": ..., "seccomp": ...}`` of config.json), the token (a pipe holding
execd's token, becomes its stdin), the container's log (execd's stdout/stderr), a pidfd of
the container's init process, one descriptor per namespace (``ns`` in the header) and one
per cgroup (``cgroup.procs`` files). The zygote itself never reads the plan or the token:
only the child does, so no sandbox's environment or token stays in the zygote's memory,
to be inherited by the next sandbox's execd. The answer is ``{"pid": <host pid>}`` once
the child is confined (``confine.py``) and about to run execd, or ``{"error": ...}``.
The header may also carry the plan's seccomp object (``seccomp``; not secret): the zygote
compiles that filter once and keeps the program (``SeccompFilters``), so each execd loads
an inherited, shared program instead of building and compiling its own (libseccomp's rule
database and code generator wrote ~1.5 MB of heap in every execd). The child still checks
that the inherited program was compiled from the very object in its plan, and builds its
own from the plan when not.

The zygote is the child subreaper of the execds it starts: when one exits, the zygote
kills its container's init (a minimal waiter), so the container stops as it did when execd
was PID 1. It exits when the server does (parent-death signal, end of its socket).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

import prctl

from sandlot.execd import confine
from sandlot.execd.protocol import SPAWN_CODE_ZYGOTE

MAX_FDS = 64
REPORT_TIMEOUT = 20.0
FIXED_FDS = ("plan", "token", "stdio", "init")


# Everything an execd imports, at start-up (``build_app`` imports its services) or on a
# later request (uploads, globs, PTY WebSockets, ...). Imported here, a module's objects sit
# in pages every execd shares; imported in an execd, it costs that execd its own copy (the
# import's objects, and the temporaries that dirty the inherited heap: profile with
# ``tools/profile_cow.py``).
PRELOAD = (
    "sandlot.execd.main", "sandlot.execd.app", "sandlot.execd.procs",
    "sandlot.execd.lazyext", "sandlot.execd.claim", "sandlot.execd.hibernation",
    "sandlot.execd.handoff",
    "sandlot.execd.cappedlog", "sandlot.execd.httpserver", "sandlot.execd.settings",
    "sandlot.execd.commands", "sandlot.execd.files", "sandlot.execd.upload",
    "sandlot.execd.metrics", "sandlot.execd.pty", "sandlot.execd.sessions",
    "logging", "resource", "shlex", "email.utils", "h11", "wcmatch.glob",
    "websockets.server", "websockets.http11", "websockets.frames",
)
# The code service and what it imports once loaded (jupyter_client, zmq, tornado, traitlets,
# dateutil: ~6 MB of heap), only in the zygote that code images' execds are forked from (a
# fork of this one, ``Zygote.spawn_code_zygote``): a forked process counts every page of its
# parent's heap in its RSS, so in the plain images' zygote they made each plain sandbox's
# execd 6 MB larger in RSS (30.5 against 24.1 MB) and 0.7 MB larger in USS, for a service a
# plain image loads only if asked.
CODE_PRELOAD = (
    "sandlot.execd.code",
    "sandlot.execd.code.routes", "sandlot.execd.code.natives", "sandlot.execd.code.readiness",
    "sandlot.execd.code.jupyter_api", "sandlot.execd.code.jupyter_api.settings",
)


def preload() -> None:
    """Import what execd imports at start-up and on its first requests (shared pages)."""
    _import_all(PRELOAD)
    from sandlot.execd.main import parser

    parser()  # built here once, shared by every execd


def compile_routes() -> None:
    """Build execd's app once and drop it, so its routes' path patterns sit compiled in
    ``re``'s cache, which every execd inherits: compiling them was over half of an execd's
    app build (~2-3 ms of each sandbox's start). Only constructors run here (no service
    starts, no files, no sockets); nothing of it stays but the compiled patterns."""
    from sandlot.execd.app import build_app
    from sandlot.execd.claim import ClaimExtension
    from sandlot.execd.lazyext import DeferredCode
    from sandlot.execd.settings import Settings

    settings = Settings(workdir="/")
    build_app(settings, extensions=[DeferredCode(settings),
                                    ClaimExtension(settings, lambda _argv: None)])


def _import_all(modules: tuple[str, ...]) -> None:
    import importlib

    for module in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def prepare(*, code: bool) -> None:
    """Everything the zygote does before its first fork (also ``tools/profile_cow.py``);
    with ``code``, then what its fork for code images does too."""
    preload()
    compile_routes()
    _freeze()
    if code:
        add_code_service()


def add_code_service() -> None:
    """What turns a fork of the plain zygote into the code images' zygote."""
    _import_all(CODE_PRELOAD)
    _freeze()


def _freeze() -> None:
    if threading.active_count() != 1:
        raise SystemExit("execd zygote: a preloaded module started a thread; cannot fork")
    gc.collect()
    gc.freeze()  # the imported objects' pages stay shared with every execd


def seccomp_key(profile: Any) -> str:
    """One text per seccomp object, whatever its key order."""
    return json.dumps(profile, sort_keys=True, separators=(",", ":"))


class SeccompFilters:
    """Seccomp programs compiled in the zygote, by the object they were compiled from.

    Bounded: sandboxes share a handful of profiles at most; past ``limit`` the oldest is
    dropped (an execd that forked with it keeps its own copy of the pages).
    """

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._built: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._built)

    def get(self, profile: Any) -> tuple[str, Any] | None:
        """``(key, filter)`` for ``profile``, built on first use; None if it cannot be
        built here (the child then builds it from its plan and reports why it failed)."""
        if not isinstance(profile, dict):
            return None
        key = seccomp_key(profile)
        if key not in self._built:
            try:
                filt = confine.CompiledFilter.of(confine.seccomp_filter(profile))
            except Exception:  # noqa: BLE001 - the child reports it, from its own plan
                return None
            if filt is None:
                return None
            while len(self._built) >= self.limit:
                del self._built[next(iter(self._built))]
            self._built[key] = filt
        return key, self._built[key]


def filter_for(plan: dict[str, Any], prebuilt: tuple[str, Any] | None) -> Any:
    """The plan's seccomp filter: the zygote's if it was built from the same object."""
    profile = plan["seccomp"]
    if prebuilt is not None and prebuilt[0] == seccomp_key(profile):
        return prebuilt[1]
    return confine.seccomp_filter(profile)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _report(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (line.replace("\n", " ") + "\n").encode())


class Request:
    """The descriptors of one launch, by role."""

    def __init__(self, header: dict[str, Any], fds: list[int]) -> None:
        names = [*FIXED_FDS, *(f"ns:{n}" for n in header["ns"]),
                 *(f"cgroup:{i}" for i in range(int(header["cgroups"])))]
        if len(names) != len(fds):
            raise ValueError(f"expected {len(names)} descriptors, got {len(fds)}")
        self.fds = dict(zip(names, fds, strict=True))
        self.ns = {n: self.fds[f"ns:{n}"] for n in header["ns"]}
        self.cgroups = [self.fds[f"cgroup:{i}"] for i in range(int(header["cgroups"]))]
        missing = set(confine.NAMESPACES) - set(self.ns)
        if missing:
            raise ValueError(f"namespaces missing: {', '.join(sorted(missing))}")

    def close(self, keep: tuple[str, ...] = ()) -> None:
        for name, fd in self.fds.items():
            if name not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _child(req: Request, report: int, prebuilt: tuple[str, Any] | None) -> NoReturn:
    """Runs in the zygote's fork, born in the sandbox's pid namespace (``confine``'s
    step 1): confine itself, then run execd."""
    code = 1
    report_open = True  # once closed, its number may be reused by execd: never written
    try:
        signal.set_wakeup_fd(-1)  # the zygote's wake-up pipe is closed here
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        confine.join_cgroups(req.cgroups)
        plan = json.loads(_read_all(req.fds["plan"]))
        confine.enter_sandbox(plan, req.ns)
        req.close(keep=("token", "stdio"))
        confine.become_execd(plan, filter_for(plan, prebuilt))
        token, stdio = req.fds["token"], req.fds["stdio"]
        os.dup2(token, 0)
        os.dup2(stdio, 1)
        os.dup2(stdio, 2)
        # Nothing of the host stays open: stdio and the report pipe only (closed below).
        os.closerange(3, report)
        os.closerange(report + 1, 1 << 20)
        args = list(plan["process"]["args"])
        argv = args[args.index("sandlot.execd") + 1:]
        sys.argv = ["sandlot-execd", *argv]
        del plan, req, prebuilt
        from sandlot.execd.main import main as execd_main

        _report(report, "ok")
        os.close(report)
        report_open = False
        code = execd_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - reported, then this child ends
        if report_open:
            _report(report, f"error {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


class Zygote:
    """The serve loop: requests on the control socket, reaping on SIGCHLD."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.execds: dict[int, int] = {}  # execd's host pid -> pidfd of its container init
        self.filters = SeccompFilters()
        # The zygote's own pid namespace: its children's is pointed back here after each
        # fork into a sandbox's (confine.fork_into).
        self.home_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    self.reap()
                    continue
                msg, fds, _flags, _addr = socket.recv_fds(self.control, 65536, MAX_FDS)
                if not msg:
                    return  # the server is gone
                if msg == SPAWN_CODE_ZYGOTE:
                    answer = self.spawn_code_zygote(fds)
                else:
                    answer = self.launch(msg, fds)
                self.control.send(json.dumps(answer).encode())

    def spawn_code_zygote(self, fds: list[int]) -> dict[str, Any]:
        """Fork the code images' zygote: this zygote with the code service imported too,
        serving on the one descriptor passed (its own control socket). Forked, not started
        afresh, it shares this zygote's pages (its own are the code service's, ~11 MiB, not
        a whole interpreter's ~28 MiB) and is ready after that import alone (~50 ms of
        CPU)."""
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return {"error": f"bad request: expected 1 descriptor, got {len(fds)}"}
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                prctl.set_pdeathsig(signal.SIGKILL)  # goes with this zygote, as with the server
                self.control.close()
                for fd in (*self.execds.values(), self.wake_r, self.wake_w, self.home_pid_ns):
                    os.close(fd)  # this zygote's: its execds are not the new one's to end
                prctl.set_child_subreaper(True)  # not inherited through fork
                add_code_service()
                Zygote(socket.socket(fileno=fds[0])).serve()
                status = 0
            finally:
                os._exit(status)
        os.close(fds[0])
        return {"pid": pid}

    def launch(self, msg: bytes, fds: list[int]) -> dict[str, Any]:
        try:
            header = json.loads(msg)
            req = Request(header, fds)
        except (ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            return {"error": f"bad request: {exc}"}
        prebuilt = self.filters.get(header.get("seccomp"))
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = confine.fork_into(req.ns["pid"], self.home_pid_ns)
        except (OSError, confine.ConfineError) as exc:  # e.g. the sandbox's PID 1 is gone
            for fd in (report_r, report_w):
                os.close(fd)
            req.close()
            return {"error": f"cannot fork into the sandbox: {exc}"}
        if pid == 0:
            self.control.close()
            for fd in (report_r, self.wake_r, self.wake_w, self.home_pid_ns):
                os.close(fd)
            _child(req, report_w, prebuilt)
        os.close(report_w)
        init = req.fds["init"]
        req.close(keep=("init",))
        lines = self._read_report(report_r).splitlines()
        os.close(report_r)
        errors = [x.removeprefix("error ") for x in lines if x.startswith("error ")]
        if "ok" in lines and not errors:
            self.execds[pid] = init
            return {"pid": pid}
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.close(init)
        return {"error": "; ".join(errors) or "the execd child ended before it was ready"}

    @staticmethod
    def _read_report(fd: int) -> str:
        out = b""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if not poller.poll(REPORT_TIMEOUT * 1000):
                return out.decode(errors="replace") + "\nerror timed out"
            chunk = os.read(fd, 4096)
            if not chunk:
                return out.decode(errors="replace")
            out += chunk

    def reap(self) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            init = self.execds.pop(pid, None)
            if init is not None:  # execd ended: end its container, as when it was PID 1
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(init, signal.SIGKILL)
                os.close(init)


def main(argv: list[str]) -> int:
    """``FD``: serve launches on the socket ``FD``."""
    prctl.set_pdeathsig(signal.SIGKILL)
    control = socket.socket(fileno=int(argv[0]))
    prctl.set_child_subreaper(True)
    prepare(code=False)
    Zygote(control).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
