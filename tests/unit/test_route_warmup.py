"""``build_routes``: the route tables are built at start. FastAPI builds an included router's
routes on the first request that reaches it, so the first API request after every server
start took ~25 ms where the next took ~2; the warm-up request reaches every route of every
included router (nested ones too), and raises nothing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from sandlot.server.route_warmup import build_routes

seen: list[str] = []


class Recording(APIRoute):
    def matches(self, scope: Any) -> Any:
        seen.append(self.path)
        return super().matches(scope)


def _app() -> FastAPI:
    outer, inner, plain = (APIRouter(route_class=Recording) for _ in range(3))

    @outer.get("/outer")
    async def outer_route() -> list[str]:
        return []

    @inner.post("/inner/{thing}")
    async def inner_route(thing: str) -> str:
        return thing

    @plain.get("/health")
    async def health() -> str:
        return "ok"

    outer.include_router(inner, prefix="/nested")
    app = FastAPI()
    app.include_router(plain)
    for prefix in ("/v1", ""):
        app.include_router(outer, prefix=prefix)
    return app


async def test_every_route_of_every_included_router_is_reached() -> None:
    app = _app()
    seen.clear()
    await build_routes(app.router)
    assert {"/outer", "/inner/{thing}", "/health"} <= set(seen), seen

