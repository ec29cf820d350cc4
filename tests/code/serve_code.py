"""Serve the code routes for tests: execd's app factory with the code extension, on loopback.

Run as ``python serve_code.py PORT TOKEN WORKDIR``. Uses the plain asyncio loop and no process
reaper, so it exercises the code service on its own; ``test_execd_binary`` covers the real
``python -m sandlot.execd`` entry point.
"""

from __future__ import annotations

import sys

import uvicorn


def main() -> None:
    port, token, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from sandlot.execd.code import build_extension
    from sandlot.execd.settings import Settings

    settings = Settings(token=token, workdir=workdir)
    ext = build_extension(settings)
    try:
        from sandlot.execd.app import build_app

        app = build_app(settings, extensions=[ext])
    except ImportError:  # execd's app is being built concurrently; a minimal stand-in meanwhile
        app = minimal_app(ext, token)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="asyncio", log_level="warning",
                lifespan="on")


def minimal_app(ext, token: str):  # type: ignore[no-untyped-def]
    """The code routes with execd's contract around them: token auth and {code, message} errors."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from sandlot.errors import SandlotError

    async def auth(request, call_next):  # type: ignore[no-untyped-def]
        if request.headers.get("x-execd-access-token") != token:
            return JSONResponse({"code": "UNAUTHORIZED", "message": "bad token"}, 401)
        return await call_next(request)

    async def on_error(request, exc):  # type: ignore[no-untyped-def]
        return JSONResponse(exc.body(), exc.status)

    @contextlib.asynccontextmanager
    async def lifespan(app):  # type: ignore[no-untyped-def]
        await ext.startup()
        try:
            yield
        finally:
            await ext.shutdown()

    async def ping(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("pong")

    return Starlette(
        routes=[Route("/ping", ping), *ext.routes],
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=auth)],
        exception_handlers={SandlotError: on_error},
        lifespan=lifespan,
    )


if __name__ == "__main__":
    main()
