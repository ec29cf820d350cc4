"""A kernel that is one long-lived runner process spoken to over pipes.

sandlot's native contexts (Node.js, Java through the JDK's JShell API) share this shape: the
runner reads one request per stdin line, writes JSON replies (``ready``, then per run ``result``,
``error`` and ``done``) to the fd named by ``SANDLOT_REPLY_FD``, and lets user output go to its
real stdout/stderr, ending each run with a sentinel line on both streams so the reader knows it
has all of the run's output before ``done``. Subclasses give the command line and the request
encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from typing import Any

from .. import identity
from .base import Emit, KernelDied, Output
from .exitwatch import returncode, watch_exit

SENTINEL_PREFIX = "\x00SANDLOT-END:"
_READ = 65536


class PipeKernel:
    """One runner process holding a context's state; interrupt is SIGINT to the runner."""

    def __init__(self, argv: list[str], language: str, *, cwd: str | None, env: dict[str, str]):
        self.language = language
        self._argv = argv
        self._cwd = cwd
        self._env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._replies: asyncio.StreamReader | None = None
        self._lock = asyncio.Lock()
        self._exit: asyncio.Future[int] | None = None

    def encode_request(self, run_id: str, code: str) -> bytes:
        """One stdin line asking the runner to run ``code`` (no trailing newline needed)."""
        return json.dumps({"id": run_id, "code": code}).encode()

    async def prepare(self) -> None:
        """Work before the runner starts (e.g. compiling it); runs inside ``start``'s timeout."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self, timeout: float) -> None:
        await asyncio.wait_for(self.prepare(), timeout)
        rfd, wfd = os.pipe()
        try:
            # The runner writes its JSON replies to this pipe, apart from the user's output.
            env = {**self._env, "SANDLOT_REPLY_FD": str(wfd)}
            self._proc = await asyncio.create_subprocess_exec(
                *self._argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=self._cwd or None, env=env,
                pass_fds=(wfd,), start_new_session=True, **identity.popen_kwargs(),
            )
        finally:
            os.close(wfd)
        self._exit = watch_exit(self._proc.pid)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 26)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(rfd, "rb", buffering=0)
        )
        self._replies = reader
        try:
            first = await asyncio.wait_for(self._next_reply(), timeout)
        except (TimeoutError, KernelDied):
            await self.shutdown()
            raise
        if first.get("type") != "ready":
            await self.shutdown()
            raise KernelDied(None)

    async def _next_reply(self) -> dict[str, Any]:
        assert self._replies is not None
        line = await self._replies.readline()
        if not line:
            raise KernelDied(await self._exit_code())
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def _exit_code(self) -> int | None:
        if self._proc is None:
            return None
        try:
            code: int | None = await asyncio.wait_for(self._proc.wait(), 2)
        except TimeoutError:
            code = None
        if self._exit is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit), 1)
        return returncode(self._exit, code)

    async def is_alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def execute(self, code: str, emit: Emit) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise KernelDied(None)
        async with self._lock:
            run_id = uuid.uuid4().hex
            sentinel = f"{SENTINEL_PREFIX}{run_id}\n".encode()
            try:
                proc.stdin.write(self.encode_request(run_id, code) + b"\n")
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise KernelDied(await self._exit_code()) from None
            pumps = [
                asyncio.create_task(_pump(proc.stdout, sentinel, "stdout", emit)),
                asyncio.create_task(_pump(proc.stderr, sentinel, "stderr", emit)),
            ]
            try:
                while True:
                    reply = await self._next_reply()
                    if reply.get("id") != run_id:
                        continue
                    kind = reply.get("type")
                    if kind == "done":
                        emit(Output("count", count=reply.get("count")))
                        # The sentinels precede "done", so both pumps finish promptly.
                        await asyncio.gather(*pumps)
                        return
                    if kind == "result":
                        emit(Output("result", data=reply.get("data", {})))
                    elif kind == "error":
                        emit(Output("error", ename=reply.get("ename", ""),
                                    evalue=reply.get("evalue", ""),
                                    traceback=list(reply.get("traceback", []))))
            except BaseException:
                for task in pumps:
                    task.cancel()
                raise

    async def interrupt(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(signal.SIGINT)

    async def shutdown(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        if self._replies is not None:
            self._replies.feed_eof()
        self._proc = None


async def _pump(stream: asyncio.StreamReader, sentinel: bytes, kind: str, emit: Emit) -> None:
    """Forward ``stream`` as ``kind`` output until this run's sentinel appears."""
    buf = b""
    while True:
        chunk = await stream.read(_READ)
        if not chunk:
            if buf:
                emit(Output(kind, text=buf.decode("utf-8", "replace")))  # type: ignore[arg-type]
            return
        buf += chunk
        idx = buf.find(sentinel)
        if idx >= 0:
            if idx:
                emit(Output(kind, text=buf[:idx].decode("utf-8", "replace")))  # type: ignore[arg-type]
            return
        # Hold back a possible sentinel start (and an incomplete UTF-8 sequence) for the next read.
        cut = buf.rfind(b"\x00", max(0, len(buf) - len(sentinel)))
        cut = len(buf) if cut < 0 else cut
        text = buf[:cut]
        keep = _utf8_tail(text)
        if len(text) - keep > 0:
            emit(Output(kind, text=text[: len(text) - keep].decode("utf-8", "replace")))  # type: ignore[arg-type]
        buf = buf[len(text) - keep:]


def _utf8_tail(data: bytes) -> int:
    """Bytes at the end of ``data`` that start an unfinished UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        if byte & 0x80 == 0:
            return 0
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return back if need > back else 0
    return 0
