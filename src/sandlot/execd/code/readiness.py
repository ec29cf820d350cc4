"""The Jupyter port ($JUPYTER_PORT, 44771): opened once kernels are ready.

The released SDK's strict readiness check (``CodeInterpreter.create``) probes the reference
image's Jupyter port inside the sandbox, so it opens only when the code service can run code.
What listens there is sandlot's Jupyter API (:mod:`.jupyter_api`); with the API switched off
(``SANDLOT_JUPYTER_API=0``) a bare listener that only signals readiness.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import CodeService

log = logging.getLogger(__name__)


async def _close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def open_ready_port(port: int, service: CodeService | None = None) -> Any:
    """Something with ``close()`` and ``wait_closed()`` listening on ``port``, or None."""
    if port <= 0:
        return None
    if service is not None:
        from .jupyter_api import serve_jupyter_api
        from .jupyter_api.settings import JupyterApiSettings

        settings = JupyterApiSettings.from_env()
        if settings.enabled:
            return await serve_jupyter_api(service, port, service.settings.execd_token, settings)
    try:
        return await asyncio.start_server(_close, "127.0.0.1", port)
    except OSError as exc:
        log.warning("code readiness port 127.0.0.1:%d not opened: %s", port, exc)
        return None
