"""Waiting until a freshly started Jupyter kernel can take a cell, without idle waits.

``KernelClient.wait_for_ready`` asks ``kernel_info`` until a reply comes, then waits up to
0.2 s for an iopub message (its proof that iopub is subscribed; without one it starts
over), and at the end "flushes" iopub: it reads until 0.2 s pass without a message. That
last wait is spent on every start, after the kernel is ready: 0.2 s of a ~1 s start, paid
by each new context that waits for a kernel (a back-to-back one waits for the pool's).

Here both proofs are awaited together: ``kernel_info`` is asked again every ``NUDGE``
seconds until the shell has answered and iopub has delivered a message. Nothing is
flushed: the iopub statuses of these requests stay queued and the run's reader skips them
(their parent is not the run's request), and ``JupyterKernel`` drops the shell replies
before each run, as it does for its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

NUDGE = 0.2  # seconds between kernel_info requests while not yet ready


async def wait_ready(client: Any, timeout: float, alive: Callable[[], Awaitable[bool]],
                     iopub: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Return once ``client``'s kernel has answered ``kernel_info`` on the shell and its
    iopub socket has received a message (``iopub()``'s result when given, else the
    client's iopub channel's). ``alive()`` is awaited between nudges; a dead kernel or
    ``timeout`` seconds raise ``RuntimeError`` (as ``wait_for_ready`` does)."""
    deadline = time.monotonic() + timeout
    first = iopub() if iopub is not None else client.iopub_channel.socket.recv_multipart()
    pending = {
        "shell": asyncio.ensure_future(client.shell_channel.socket.recv_multipart()),
        "iopub": asyncio.ensure_future(first),
    }
    try:
        while pending:
            client.kernel_info()
            done, _ = await asyncio.wait(pending.values(), timeout=NUDGE)
            for name, future in list(pending.items()):
                if future in done:
                    future.result()  # a socket error ends the wait
                    del pending[name]
            if not pending:
                return
            if not await alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")
    finally:
        for future in pending.values():
            future.cancel()
            with contextlib.suppress(BaseException):
                await future
