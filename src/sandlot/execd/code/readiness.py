"""A TCP port that opens once kernels are ready.

The released SDK's strict readiness check (``CodeInterpreter.create``) probes the reference
image's Jupyter port inside the sandbox (``$JUPYTER_PORT``, 44771); sandlot has no Jupyter server,
so the code service opens that port itself when it can run code.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def _close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def open_ready_port(port: int) -> asyncio.Server | None:
    if port <= 0:
        return None
    try:
        return await asyncio.start_server(_close, "127.0.0.1", port)
    except OSError as exc:
        log.warning("code readiness port 127.0.0.1:%d not opened: %s", port, exc)
        return None
