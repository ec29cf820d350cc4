"""The code-context service, loaded after execd listens instead of before.

Importing it (jupyter_client, zmq, tornado, dateutil, ...) is most of execd's start-up time,
and ``/ping`` must answer as soon as possible. So execd mounts this stand-in for every path
under ``/code``: ``load()`` (called in the background once execd listens, or after a pooled
execd is claimed, so that the service reads the sandbox's environment) imports the service,
builds it and runs its ``startup()`` (kernel pre-warming, the readiness port); a request that
arrives before that waits for it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping
from typing import Any

from starlette.routing import BaseRoute, Match, Router
from starlette.types import Receive, Scope, Send

from sandlot.execd.protocol import code_at_start

log = logging.getLogger("sandlot.execd")

PREFIX = "/code"
MODULE = "sandlot.execd.code"


class _Deferred(BaseRoute):
    """Matches ``/code`` and ``/code/...``; dispatches to the loaded service's own routes."""

    def __init__(self, owner: DeferredCode) -> None:
        self.owner = owner

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if scope["type"] in ("http", "websocket") and (
            path == PREFIX or path.startswith(PREFIX + "/")
        ):
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        router = await self.owner.load()
        await router(scope, receive, send)


def wanted_at_start(environ: Mapping[str, str]) -> bool:
    """Load the code service eagerly? Only in code images (``protocol.code_at_start``);
    elsewhere on the first ``/code``.

    Loading costs ~100 ms of CPU and ~5 MB, which would otherwise land on every sandbox's
    first moments (and on the create latency of pooled sandboxes, right after their claim).
    """
    return code_at_start(environ)


class DeferredCode:
    """An execd extension standing in for the code service until it is loaded."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.routes: list[BaseRoute] = [_Deferred(self)]
        self._ext: Any = None
        self._router: Router | None = None
        self._loading: asyncio.Task[Router] | None = None

    def start_loading(self) -> None:
        """Begin loading in the background (idempotent)."""
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())

    async def load(self) -> Router:
        self.start_loading()
        assert self._loading is not None
        return await asyncio.shield(self._loading)

    async def _load(self) -> Router:
        ext = None
        try:
            # The import is the slow part: off the event loop, so requests keep flowing.
            code = await asyncio.to_thread(importlib.import_module, MODULE)
            factory = getattr(code, "build_extension", None)
            ext = factory(self.settings) if factory is not None else None
            if ext is not None:
                await ext.startup()
        except Exception:  # noqa: BLE001 - execd keeps serving everything else
            log.exception("the code service could not be loaded")
            ext = None
        self._ext = ext
        self._router = Router(routes=list(ext.routes) if ext is not None else [])
        return self._router

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._ext is not None:
            await self._ext.shutdown()
