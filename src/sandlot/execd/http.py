"""Small request/response helpers shared by execd's routes (one error shape everywhere)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sandlot.errors import InvalidRequest, NotFound, SandlotError

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class JSON(Response):
    """Compact JSON response (no pydantic on the hot path)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _encode(content).encode()


def ok() -> Response:
    return Response(status_code=200)


def error_response(exc: SandlotError) -> Response:
    return JSON(exc.body(), status_code=exc.status)


def bad_request(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="INVALID_REQUEST_BODY")


def missing_query(name: str) -> InvalidRequest:
    return InvalidRequest(f"missing query parameter '{name}'", code="MISSING_QUERY")


def not_found(message: str, code: str = "NOT_FOUND") -> NotFound:
    return NotFound(message, code=code)


async def json_body(request: Request, *, required: bool = True) -> Any:
    """The parsed JSON body; 400 ``INVALID_REQUEST_BODY`` when absent (if required) or malformed."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise bad_request("request body is required")
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None


def expect_object(value: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{what} must be a JSON object")
    return value


async def optional_object(request: Request) -> dict[str, Any]:
    """The body's JSON object; ``{}`` for an empty body (the code APIs' optional bodies)."""
    body = await json_body(request, required=False)
    return {} if body is None else expect_object(body)


def query_int(request: Request, name: str, *, minimum: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter '{name}' must be an integer") from None
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"query parameter '{name}' must be >= {minimum}")
    return value


def query_paths(request: Request, name: str = "path") -> list[str]:
    values = [v for v in request.query_params.getlist(name) if v != ""]
    if not values:
        raise missing_query(name)
    return values
