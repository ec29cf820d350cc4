"""The server's side of the execd zygote (``[runtime] execd_launch = "zygote"``).

Instead of runc starting a fresh Python for execd in every sandbox (~250 ms of CPU, ~20 MB
of private memory), runc starts a minimal waiter as the container's PID 1 (catatonit in
pause mode: it only reaps) and the zygote (``sandlot.execd.zygote``, execd imported once)
forks a child that enters the container and becomes execd, sharing the imported pages
copy-on-write. What runs where and why it is safe: docs/runtime.md.

The zygote is started when the serving runtime opens (``start``; else on first use),
restarted when it has died, and killed on ``close``
(and by the kernel when the server dies: parent-death signal). Execds it started keep
running when it goes: they belong to their containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandlot.errors import RuntimeFailure
from sandlot.execd.protocol import SPAWN_CODE_ZYGOTE, code_at_start
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.oci import cgroups
from sandlot.runtime.oci.spec import env_dict

log = logging.getLogger(__name__)
# The container's PID 1 under the zygote: bind-mounted read-only from the host.
WAITER_PATH = "/run/sandlot/init"
NAMESPACES = ("net", "user", "mnt", "ipc", "uts", "cgroup", "pid")
LAUNCH_TIMEOUT = 30.0
# A seccomp object up to this size travels in the launch header (the zygote reads up to
# 64 KiB) so the zygote builds its filter once; a larger one is built by each execd.
MAX_SHARED_SECCOMP = 48 << 10
# The private mount namespace the zygote runs in: the bundle at /opt/sandlot (a tmpfs over
# /opt hides the host's), so its imports resolve to the paths they have inside sandboxes.
_ENTER = ('mount -t tmpfs -o mode=0755,size=64k sandlot-zygote /opt && mkdir /opt/sandlot '
          '&& mount --bind -o ro,nosuid,nodev "$1" /opt/sandlot && shift && exec "$@"')


def waiter_binary() -> str | None:
    """catatonit (Debian package ``catatonit``, statically linked): PID 1 that only reaps."""
    return shutil.which("catatonit")


def unavailable_reason(bundle: ExecdBundle) -> str | None:
    """Why the zygote cannot run on this host (None: it can)."""
    if waiter_binary() is None:
        return "catatonit (the containers' PID 1) is not installed: apt-get install catatonit"
    if shutil.which("unshare") is None:
        return "util-linux's unshare is not installed"
    site = bundle.path / "site-packages"
    for module in ("prctl.py", "pyseccomp.py"):
        if not (site / module).exists():
            return (f"the execd bundle lacks {module} (pip install python-prctl pyseccomp; "
                    "python-prctl builds against libcap-dev)")
    return None


def waiter_process(execd_process: dict[str, Any]) -> dict[str, Any]:
    """runc's ``process`` for the waiter: execd's, with the waiter's command.

    Same user, capabilities, environment, limits and hardening: ``runc exec`` takes its
    defaults from this object, so a process run that way still gets what execd's children
    get (as before the zygote).
    """
    return {**execd_process, "args": [WAITER_PATH, "-P"]}


def use_waiter(config: dict[str, Any], waiter: str) -> dict[str, Any]:
    """Make ``config`` start the waiter; returns the plan for the zygote (execd's process)."""
    plan = {"process": config["process"], "seccomp": config["linux"].get("seccomp", {})}
    config["process"] = waiter_process(config["process"])
    config["mounts"].append({"destination": WAITER_PATH, "type": "bind", "source": waiter,
                             "options": ["bind", "ro", "nosuid", "nodev"]})
    return plan


def _pipe_holding(data: bytes) -> int:
    """The read end of a pipe that holds ``data`` and then ends."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    finally:
        os.close(write_end)
    return read_end


def open_launch_fds(init_pid: int, container_id: str, plan: dict[str, Any], token: str,
                    stdio: Path) -> tuple[dict[str, Any], list[int]]:
    """The header and descriptors of one launch (see ``sandlot.execd.zygote``)."""
    fds: list[int] = []
    try:
        pidfd = os.pidfd_open(init_pid)
        fds.append(_pipe_holding(json.dumps(plan).encode()))
        fds.append(_pipe_holding(token.encode()))
        fds.append(os.open(stdio, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
        fds.append(pidfd)
        for ns in NAMESPACES:
            fds.append(os.open(f"/proc/{init_pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC))
        procs = [d / "cgroup.procs" for d in cgroups.sandbox_cgroup_dirs(container_id)]
        procs = [p for p in procs if p.exists()]
        if not procs:
            raise RuntimeFailure(f"container {container_id} has no cgroup to join")
        for p in procs:
            fds.append(os.open(p, os.O_WRONLY | os.O_CLOEXEC))
        signal.pidfd_send_signal(pidfd, 0)  # still the same init: its namespaces are its
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    header: dict[str, Any] = {"ns": list(NAMESPACES), "cgroups": len(procs)}
    seccomp = plan.get("seccomp")
    if seccomp and len(json.dumps(seccomp)) <= MAX_SHARED_SECCOMP:
        header["seccomp"] = seccomp  # built once in the zygote, shared by the execds
    return header, fds


def stop_if_half_started(runc_root: Path, container_id: str, config_json: Path) -> bool:
    """Stop a container whose execd never came: its waiter alone in its cgroup.

    A server killed between ``runc run`` and the zygote's answer leaves such a container; it
    would look Running and never answer. Killing its PID 1 stops it, as when execd dies, so
    the server's reconciliation sees a failed sandbox. True when it was stopped.
    """
    try:
        process = json.loads(config_json.read_text())["process"]
        state = json.loads((runc_root / container_id / "state.json").read_text())
        init = int(state["init_process_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if process.get("args", [None])[0] != WAITER_PATH or init <= 0:
        return False
    members: set[int] = set()
    for d in cgroups.sandbox_cgroup_dirs(container_id):
        with contextlib.suppress(OSError, ValueError):
            members |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    if members - {init} or init not in members:
        return False  # execd (or something) runs beside it, or the init is not there
    with contextlib.suppress(ProcessLookupError):
        os.kill(init, signal.SIGKILL)
    log.warning("container %s had no execd (a server stopped mid-start): stopped it",
                container_id)
    return True


class _Child:
    """The plain images' zygote: a child process of the server."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pid = proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGKILL)

    async def wait(self) -> None:
        await self._proc.wait()


class _Forked:
    """The code images' zygote: a child of the plain images' one, so the server watches it
    through a pidfd (its parent reaps it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)

    @property
    def alive(self) -> bool:
        if self._fd < 0:
            return False
        readable, _, _ = select.select([self._fd], [], [], 0)  # a pidfd reads once it ended
        return not readable

    def kill(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    async def wait(self) -> None:
        if self._fd < 0:
            return
        if self.alive:
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[None] = loop.create_future()

            def settle() -> None:
                if not ended.done():
                    ended.set_result(None)

            loop.add_reader(self._fd, settle)
            try:
                await ended
            finally:
                loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1


class ZygoteLauncher:
    """One zygote process (of a runtime's two, see ``Zygotes``); launches are sent one at a
    time. ``parent``: the plain images' launcher, whose zygote forks this one (the code
    images'); None: this one starts its zygote itself."""

    def __init__(self, bundle: ExecdBundle, *, parent: ZygoteLauncher | None = None) -> None:
        self.bundle = bundle
        self.parent = parent
        self._proc: _Child | _Forked | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()
        self.starts = 0  # how many zygotes were started (restarts included)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.alive else None

    @property
    def running(self) -> bool:
        return self.pid is not None and self._sock is not None

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if self.parent is not None:
                pid = await self.parent.fork_code_zygote(theirs.fileno())
                try:
                    self._proc = _Forked(pid)
                except ProcessLookupError as exc:  # ended (and reaped) already
                    raise RuntimeFailure("the code images' execd zygote ended as it "
                                         "started") from exc
            else:
                self._proc = _Child(await self._spawn(theirs.fileno()))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self.starts += 1
        log.info("execd zygote%s started (pid %s) from %s",
                 " of code images" if self.parent is not None else "", self._proc.pid,
                 self.bundle.mount_point)

    async def _spawn(self, control_fd: int) -> asyncio.subprocess.Process:
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _ENTER,
                "sh", str(self.bundle.path), *self.bundle.python_argv(), "-m",
                "sandlot.execd.zygote", str(control_fd)]
        # A clean environment: the zygote's is what /proc/<execd>/environ would show.
        env = {**self.bundle.env(), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        return await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL, cwd="/", pass_fds=(control_fd,))

    async def fork_code_zygote(self, control_fd: int) -> int:
        """Have this zygote fork the code images' zygote, serving on ``control_fd`` (a copy
        is passed); its host pid."""

        async def request() -> tuple[bytes, list[int]]:
            return SPAWN_CODE_ZYGOTE, [os.dup(control_fd)]

        return await self._request(request, "cannot start the code images' execd zygote")

    async def start(self) -> None:
        """Start the zygote now unless it runs: at the server's start, so that its imports
        (~250 ms of CPU) overlap the server's own start-up instead of delaying the first
        cold create. Only the process is spawned; its first launch waits for the imports."""
        async with self._lock:
            await self._ensure_running()

    async def _ensure_running(self) -> None:
        """(Re)start the zygote unless it runs; under ``_lock``."""
        if not self.running:
            await self._stop()
            await self._start()

    async def launch(self, init_pid: int, container_id: str, plan: dict[str, Any], token: str,
                     stdio: Path) -> int:
        """Start execd inside ``container_id``; its host pid. One retry on a fresh zygote."""

        async def request() -> tuple[bytes, list[int]]:
            header, fds = await asyncio.to_thread(open_launch_fds, init_pid, container_id,
                                                  plan, token, stdio)
            return json.dumps(header).encode(), fds

        return await self._request(request, f"cannot start execd in {container_id}")

    async def _request(self, make: Callable[[], Awaitable[tuple[bytes, list[int]]]],
                       refused: str) -> int:
        """Send ``make()``'s message and descriptors (closed here) to the zygote, restarted
        first if it is not running; the pid it answers. One retry on a fresh zygote."""
        async with self._lock:
            for attempt in (1, 2):
                await self._ensure_running()
                message, fds = await make()
                try:
                    answer = await asyncio.wait_for(self._ask(message, fds), LAUNCH_TIMEOUT)
                except (OSError, EOFError, TimeoutError) as exc:
                    log.warning("execd zygote failed (%s); restarting it", exc)
                    await self._stop()
                    if attempt == 2:
                        raise RuntimeFailure(f"the execd zygote failed: {exc}") from exc
                    continue
                except BaseException:
                    # Cancelled mid-request: its answer would be read as the next one's.
                    self._abandon()
                    raise
                finally:
                    for fd in fds:
                        os.close(fd)
                if "pid" in answer:
                    return int(answer["pid"])
                raise RuntimeFailure(f"{refused}: {answer.get('error', answer)}")
        raise AssertionError("unreachable")

    async def _ask(self, message: bytes, fds: list[int]) -> dict[str, Any]:
        sock = self._sock
        assert sock is not None
        loop = asyncio.get_running_loop()
        socket.send_fds(sock, [message], fds)
        reply = await loop.sock_recv(sock, 65536)
        if not reply:
            raise EOFError("the zygote closed its socket")
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def _abandon(self) -> None:
        """Kill the zygote now; ``_stop`` (at the next launch or close) reaps it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None and self._proc.alive:
            self._proc.kill()

    async def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits at the end of its socket
            self._sock = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.alive:
            proc.kill()
        await proc.wait()

    async def close(self) -> None:
        async with self._lock:
            await self._stop()


class Zygotes:
    """A runtime's two zygotes: one for plain images, started with the runtime, and one for
    code images (their execd loads the code service at start), forked from the first on
    first use, so the two share the pages of what both imported.

    Two because a forked execd counts every page of its zygote's heap in its RSS: the code
    service's libraries in the one zygote made each plain sandbox's execd 6 MB larger in RSS
    and 0.7 MB in USS; a code image's execd importing them itself would pay ~100 ms of CPU
    and 6 MB of its own instead. Which one serves a sandbox follows the environment execd
    gets (``protocol.code_at_start``).
    """

    def __init__(self, bundle: ExecdBundle) -> None:
        self.plain = ZygoteLauncher(bundle)
        self.code = ZygoteLauncher(bundle, parent=self.plain)

    def for_process(self, process: dict[str, Any]) -> ZygoteLauncher:
        """The zygote for execd's OCI ``process`` (its ``env``: ``NAME=value`` strings)."""
        env = env_dict(process.get("env") or [])
        return self.code if code_at_start(env) else self.plain

    async def start(self) -> None:
        """Start the plain images' zygote now (``ZygoteLauncher.start``).

        The code images' one is forked with the first code sandbox (``start_for``), whose
        start then also waits for the code service's import in it (~50 ms of CPU): forked
        here, every server would hold its ~11 MiB of its own, also where no code image is
        ever used.
        """
        await self.plain.start()

    async def start_for(self, process: dict[str, Any]) -> None:
        """Start the zygote for ``process`` unless it runs, without waiting for its imports:
        called before ``runc run``, so they overlap the container's start. A running one is
        left alone without taking its lock, which a launch in flight holds."""
        launcher = self.for_process(process)
        if not launcher.running:
            await launcher.start()

    async def launch(self, init_pid: int, container_id: str, plan: dict[str, Any], token: str,
                     stdio: Path) -> int:
        """``ZygoteLauncher.launch`` on the zygote for ``plan``'s process."""
        return await self.for_process(plan["process"]).launch(init_pid, container_id, plan,
                                                              token, stdio)

    async def close(self) -> None:
        await self.code.close()
        await self.plain.close()
