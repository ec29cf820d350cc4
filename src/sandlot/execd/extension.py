"""What a plug-in service (e.g. code contexts) gives execd's app factory."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from starlette.routing import BaseRoute


@runtime_checkable
class Extension(Protocol):
    """Routes mounted beside execd's own (same auth and error handling), plus hooks.

    ``startup`` runs before the first request is served, ``shutdown`` when execd stops.
    """

    routes: list[BaseRoute]

    async def startup(self) -> None: ...

    async def shutdown(self) -> None: ...
