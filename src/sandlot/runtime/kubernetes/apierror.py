"""What the API server said when it refused a request."""

from __future__ import annotations

import contextlib
import json

from kubernetes_asyncio.client.exceptions import ApiException


def explain(exc: ApiException) -> str:
    """The API server's message of an error (its Status body), else the HTTP reason."""
    with contextlib.suppress(Exception):
        message = json.loads(exc.body or "{}").get("message")
        if message:
            return str(message)
    return f"HTTP {exc.status} {exc.reason}"
