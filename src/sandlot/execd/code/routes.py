"""The /code routes of the execd contract. Auth and the error handler are the app's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from sandlot.errors import InvalidRequest, RuntimeFailure
from sandlot.execd import sse
from sandlot.execd.http import optional_object

if TYPE_CHECKING:
    from .service import CodeService


def _str_field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"'{name}' is required", code="INVALID_REQUEST_BODY")
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", code="INVALID_REQUEST_BODY")
    return value


def _language_param(request: Request, *, required: bool) -> str | None:
    language = request.query_params.get("language") or None
    if required and language is None:
        raise InvalidRequest("query parameter 'language' is required", code="MISSING_QUERY")
    return language


def build_routes(service: CodeService) -> list[BaseRoute]:
    async def create_context(request: Request) -> Response:
        body = await optional_object(request)
        language = _str_field(body, "language") or "python"
        cwd = _str_field(body, "cwd")
        ctx = await service.create_context(language, cwd)
        # As the reference: the answer echoes the request's cwd beside the new id.
        return JSONResponse({**ctx.public(), **({"cwd": cwd} if cwd else {})})

    async def list_contexts(request: Request) -> Response:
        contexts = service.list_contexts(_language_param(request, required=False))
        return JSONResponse([c.public() for c in contexts])

    async def delete_contexts(request: Request) -> Response:
        language = _language_param(request, required=True)
        assert language is not None
        await service.delete_language(language)
        return Response(status_code=200)

    async def get_context(request: Request) -> Response:
        return JSONResponse(service.get_context(request.path_params["context_id"]).public())

    async def delete_context(request: Request) -> Response:
        await service.delete_context(request.path_params["context_id"])
        return Response(status_code=200)

    async def run_code(request: Request) -> Response:
        body = await optional_object(request)
        code = _str_field(body, "code", required=True)
        assert code is not None
        context = body.get("context") or {}
        if not isinstance(context, dict):
            raise InvalidRequest("'context' must be an object", code="INVALID_REQUEST_BODY")
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout < 0):
            raise InvalidRequest("'timeout' must be a non-negative number of seconds",
                                 code="INVALID_REQUEST_BODY")
        context_id = _str_field(context, "id")
        language = _str_field(context, "language")
        if context_id is not None:
            if context_id not in service.contexts:  # the reference's answer: 500, not 404
                raise RuntimeFailure("error running codes context not found")
            ctx = service.get_context(context_id)
            if language is not None and service.catalog.specs.get(ctx.language) is not None \
                    and service._spec(language).language != ctx.language:
                raise InvalidRequest(
                    f"context {context_id} is {ctx.language}, not {language}",
                    code="INVALID_REQUEST_BODY",
                )
        else:
            ctx = await service.default_context(language or "python")

        framing = sse.wants_sse(request)

        async def stream() -> AsyncIterator[bytes]:
            number = 0
            async for batch in service.run(ctx, code, float(timeout) if timeout else None,
                                           keepalive=service.settings.keepalive):
                if not batch:  # quiet: the reference's ping event, or an SSE comment
                    yield sse.KEEPALIVE if framing else sse.ping_frame()
                    continue
                frames = []
                for ev in batch:
                    number += 1
                    frames.append(sse.encode(ev, event_id=number, sse=framing))
                yield b"".join(frames)

        return sse.interruptible_sse_response(stream())

    async def interrupt(request: Request) -> Response:
        target = request.query_params.get("id")
        if not target:
            raise InvalidRequest("query parameter 'id' is required", code="MISSING_QUERY")
        await service.interrupt(target)
        return Response(status_code=200)

    return [
        Route("/code/context", create_context, methods=["POST"]),
        Route("/code/contexts", list_contexts, methods=["GET"]),
        Route("/code/contexts", delete_contexts, methods=["DELETE"]),
        Route("/code/contexts/{context_id}", get_context, methods=["GET"]),
        Route("/code/contexts/{context_id}", delete_context, methods=["DELETE"]),
        Route("/code", run_code, methods=["POST"]),
        Route("/code", interrupt, methods=["DELETE"]),
    ]
