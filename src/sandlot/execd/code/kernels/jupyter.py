"""A Jupyter kernel driven directly over ZMQ with jupyter_client (no Jupyter server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from sandlot.execd.oomscore import prefer_for_oom

from .. import identity, kernelstdio
from . import ready, snapshot
from .base import Emit, KernelDied, Output
from .exitwatch import returncode, watch_exit
from .listener import SocketListener

log = logging.getLogger(__name__)

# How long to wait for an iopub message before checking that the kernel still lives.
_POLL = 0.5
# An interrupt asked for before the kernel has taken up the run goes out once it has (see
# ``interrupt``): on ``execute_input``, or this long after ``busy`` for a kernel that does not
# echo its input. Not shorter: ipykernel reports busy before it handles the request, and a
# signal that lands between the two ends the run without its KeyboardInterrupt error.
_BUSY_WITHOUT_INPUT = 1.0
# And this long after it, for the kernel to be in the cell's code rather than its own.
_INTO_THE_CELL = 0.05
# The client's channels: requests (shell) only; iopub is read by ``SocketListener`` on a
# socket of its own (see kernels/listener.py). No heartbeat: its
# channel is a thread per kernel pinging every second (a third of execd's samples in a code
# run's profile, and an idle wake-up per kernel); liveness is the kernel process itself
# (``is_alive``, the exit watch). No stdin (runs do not allow input) or control channel
# (interrupts go through the kernel manager).
CHANNELS = {"shell": True, "iopub": False, "stdin": False, "hb": False, "control": False}


class JupyterKernel:
    """One kernel process started from a (resolved) kernelspec."""

    def __init__(
        self,
        ksm: KernelSpecManager,
        kernel_name: str,
        language: str,
        *,
        cwd: str | None,
        env: dict[str, str],
    ):
        self.language = language
        self._km = AsyncKernelManager(kernel_name=kernel_name, kernel_spec_manager=ksm)
        self._cwd = cwd
        self._env = env
        self._kc: Any = None
        self._iopub: SocketListener | None = None
        self._shell: zmq.Socket[bytes] | None = None  # a plain shadow of the client's shell
        self._exit: asyncio.Future[int] | None = None
        # The run in flight: whether the kernel has taken it up, and an interrupt waiting
        # for that moment.
        self._run_begun = True
        self._interrupt_waiting = False
        self._signals: set[asyncio.Task[None]] = set()

    @property
    def manager(self) -> AsyncKernelManager:
        """The kernel's manager, for the Jupyter API, which speaks to the kernel over ZMQ itself."""
        return self._km

    def release_client(self) -> None:
        """Stop this object's own channels (the Jupyter API takes the kernel over)."""
        self._stop_client()

    def _stop_client(self) -> None:
        self._shell = None
        if self._iopub is not None:
            self._iopub.close()
            self._iopub = None
        if self._kc is not None:
            self._kc.stop_channels()
            self._kc = None

    @property
    def pid(self) -> int | None:
        proc = getattr(self._km.provisioner, "process", None)
        return getattr(proc, "pid", None)

    def _returncode(self) -> int | None:
        proc = getattr(self._km.provisioner, "process", None)
        polled = proc.poll() if proc is not None else None
        return returncode(self._exit, polled)

    async def start(self, timeout: float) -> None:
        identity.prepare_connection_file(self._km)
        await self._km.start_kernel(cwd=self._cwd, env=self._env, **identity.popen_kwargs(),
                                    **kernelstdio.popen_kwargs())
        # Preferred by the OOM killer from its first moment, not only once it answers (the
        # caller raises it and its descendants again then): a kernel starting beside a cell
        # that hit the memory limit would otherwise carry execd's own score, and between
        # equals the OOM killer takes the larger process, execd.
        prefer_for_oom(self.pid)
        self._exit = watch_exit(self.pid)
        self._kc = self._km.client()
        self._kc.start_channels(**CHANNELS)
        self._iopub = SocketListener(self._km.connect_iopub(), self._kc.session)
        try:
            await ready.wait_ready(self._kc, timeout, self._drain_and_alive,
                                   iopub=self._iopub.first)
        except RuntimeError as exc:
            log.warning("kernel not ready: %s; %s", exc, snapshot.describe(
                self.pid, (self._km.shell_port, self._km.iopub_port)))
            await self.shutdown()
            raise KernelDied(self._returncode()) from exc
        except BaseException:
            await self.shutdown()
            raise

    async def _drain_and_alive(self) -> bool:
        """``is_alive`` for readiness's nudges, which also take any iopub message queued."""
        if self._iopub is not None:
            self._iopub.drain()
        return await self.is_alive()

    async def is_alive(self) -> bool:
        return bool(await self._km.is_alive())

    async def execute(self, code: str, emit: Emit) -> None:
        kc, iopub = self._kc, self._iopub
        assert iopub is not None
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._run_begun, self._interrupt_waiting = False, False

        def begin_unless_over() -> None:
            if not done.done():
                self._begin()

        def handle(msg: dict[str, Any]) -> bool:
            if msg.get("parent_header", {}).get("msg_id") != msg_id or done.done():
                return False
            if not self._run_begun:
                kind = msg["msg_type"]
                if kind == "execute_input":
                    self._begin()
                elif kind == "status" and msg["content"].get("execution_state") == "busy":
                    loop.call_later(_BUSY_WITHOUT_INPUT, begin_unless_over)
            try:
                if not self._emit(msg, emit):
                    return False
            except Exception as exc:  # fails the run, as it did when raised in this task
                done.set_exception(exc)
                return True
            done.set_result(None)
            return True

        iopub.listen(handle)
        try:
            while not done.done():
                await asyncio.wait({done}, timeout=_POLL)
                if not done.done():
                    iopub.drain()
                if not done.done() and not await self._km.is_alive():
                    await asyncio.sleep(0.05)  # let the reaper record the status
                    raise KernelDied(self._returncode()) from None
            done.result()
            self._drop_replies()
        finally:
            iopub.listen(None)
            done.cancel()  # over however it ended: a busy timer left must not touch the next run
            self._run_begun, self._interrupt_waiting = True, False

    @staticmethod
    def _emit(msg: dict[str, Any], emit: Emit) -> bool:
        """Hand one iopub message of the run to ``emit``; True when the run is over."""
        kind = msg["msg_type"]
        content = msg["content"]
        if kind == "stream":
            emit(Output("stderr" if content.get("name") == "stderr" else "stdout",
                        text=content.get("text", "")))
        elif kind in ("execute_result", "display_data"):
            # Only an execute_result carries an execution count (see EventShaper).
            emit(Output("result", data=dict(content.get("data", {})),
                        count=content.get("execution_count")))
        elif kind == "error":
            emit(Output("error", ename=content.get("ename", ""),
                        evalue=content.get("evalue", ""),
                        traceback=list(content.get("traceback", []))))
        elif kind == "execute_input":
            emit(Output("count", count=content.get("execution_count")))
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False

    def _drop_replies(self) -> None:
        """Drop the shell replies that have arrived: they carry nothing the events need (the
        output came on iopub), and unread they would pile up for the kernel's lifetime.
        Taken from the socket without waiting (through a plain shadow of it: no future per
        receive) and not unpacked (unpacking them through ``get_shell_msg`` was a tenth of
        execd's CPU per warm run)."""
        if self._shell is None:
            self._shell = zmq.Socket.shadow(self._kc.shell_channel.socket.underlying)
        with contextlib.suppress(zmq.Again):
            while True:
                self._shell.recv_multipart(zmq.NOBLOCK)

    async def interrupt(self) -> None:
        """Interrupt the run; one the kernel has not yet taken up is interrupted once it has.

        A Jupyter interrupt is SIGINT, and ipykernel ignores SIGINT between requests (its
        handler is installed only while one is handled): sent before a slow or loaded kernel
        reads the run's request, it is lost and the cell runs on. The caller does not wait
        for that moment; a run stopped on a timeout is killed if it never comes."""
        if not self._run_begun:
            self._interrupt_waiting = True
            return
        await self._km.interrupt_kernel()

    def _begin(self) -> None:
        """The kernel has taken up the run: send the interrupt that waited for it."""
        if self._run_begun:
            return
        self._run_begun = True
        if self._interrupt_waiting:
            self._interrupt_waiting = False
            task = asyncio.get_running_loop().create_task(self._send_interrupt())
            self._signals.add(task)
            task.add_done_callback(self._signal_sent)

    async def _send_interrupt(self) -> None:
        await asyncio.sleep(_INTO_THE_CELL)
        await self._km.interrupt_kernel()

    def _signal_sent(self, task: asyncio.Task[None]) -> None:
        self._signals.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("interrupting the %s kernel failed: %s", self.language, task.exception())

    async def shutdown(self) -> None:
        self._stop_client()
        try:
            if self._km.has_kernel:
                await self._km.shutdown_kernel(now=True)
        except Exception:  # a dead kernel may refuse a clean shutdown
            await asyncio.shield(self._km.cleanup_resources(restart=False))
