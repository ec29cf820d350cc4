"""Building the API's route tables at start, not on the first client request.

FastAPI builds an included router's route list the first time a request reaches it: the
first API request after every server start took ~25 ms where the next ones took ~2
(``GET /v1/sandboxes`` on a fresh server, measured). Routing one request for a path that no
route has through the app's router (the public ASGI call) reaches every router once, before
the server accepts connections. It goes around the middleware: nothing is authenticated,
counted, traced or logged, and its 404 answer is dropped.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp

NO_SUCH_PATH = "/v1/.sandlot-route-warm-up"


async def build_routes(router: ASGIApp) -> None:
    """Route a request for ``NO_SUCH_PATH`` through ``router`` and drop the answer."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": "GET", "scheme": "http", "path": NO_SUCH_PATH,
        "raw_path": NO_SUCH_PATH.encode(), "root_path": "", "query_string": b"",
        "headers": [], "server": ("127.0.0.1", 0), "client": ("127.0.0.1", 0),
    }

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        return None

    await router(scope, receive, send)
