"""``POST /_sandlot/claim``: turns a pooled (pre-started, anonymous) execd into a sandbox's.

Only mounted with ``--pooled``, only answers once, and only to the pool's token (the normal
token check applies: the path is not open). The host's runtime calls it when it hands a warm
container to a new sandbox; the body is ``{"env": {..}, "token": str | null, "entrypoint":
[..]}``. execd then takes the sandbox's environment, switches to the sandbox's token (the pool
token stops working at once) and starts the user's entrypoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandlot.execd import protocol
from sandlot.execd.http import JSON, bad_request, expect_object, json_body, not_found
from sandlot.execd.settings import Settings

CLAIM_PATH = protocol.CLAIM_PATH


def _str_map(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in value.items()
    ):
        raise bad_request("'env' must map variable names to strings")
    return value


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise bad_request("'entrypoint' must be a list of strings")
    return value


class ClaimExtension:
    """The claim route as an execd extension; ``on_claim(entrypoint)`` runs after the switch."""

    def __init__(self, settings: Settings, on_claim: Callable[[list[str]], None]) -> None:
        self.settings = settings
        self.on_claim = on_claim
        self.claimed = False
        self.routes: list[BaseRoute] = [Route(CLAIM_PATH, self._claim, methods=["POST"])]

    async def _claim(self, request: Request) -> Response:
        if self.claimed:
            raise not_found("this execd has been claimed already")
        body = expect_object(await json_body(request))
        env = _str_map(body.get("env"))
        entrypoint = _argv(body.get("entrypoint"))
        token = body.get("token")
        if token is not None and (not isinstance(token, str) or not token):
            raise bad_request("'token' must be a non-empty string or null")
        self.claimed = True
        os.environ.update(env)
        self.settings.token = token
        self.on_claim(entrypoint)
        return JSON({"claimed": True})

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None
