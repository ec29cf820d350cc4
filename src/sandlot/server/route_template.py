"""The route template of a handled request (``/v1/sandboxes/{sandbox_id}``): a label for
metrics and a span name that never carries ids."""

from __future__ import annotations

from starlette.types import Scope

API_PREFIX = "/v1"


def route_template(scope: Scope) -> str | None:
    """The matched route's path, with the ``/v1`` prefix the request used (routers are
    mounted at ``/v1`` and at ``/``; the router reports the path without its prefix)."""
    path = getattr(scope.get("route"), "path", None)
    if not path:
        return None
    path = str(path)
    if scope["path"].startswith(API_PREFIX + "/") and not path.startswith(API_PREFIX + "/"):
        return API_PREFIX + path
    return path
