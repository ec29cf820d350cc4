"""The control-plane ASGI app: ``create_app(cfg, runtime)``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from sandlot import __version__
from sandlot.config import Config
from sandlot.console.routes import install_console, open_sessions
from sandlot.runtime.base import Runtime
from sandlot.server.api import (
    diagnostics,
    meta,
    networkpolicy,
    pools_api,
    prometheus,
    proxy,
    sandboxes,
    sdk_metrics,
    snapshots_api,
    templates_api,
)
from sandlot.server.auth import ApiKeyMiddleware
from sandlot.server.body_limit import BodyLimitMiddleware
from sandlot.server.errors import install_error_handlers
from sandlot.server.observability import Observability
from sandlot.server.pools import PoolService
from sandlot.server.route_warmup import build_routes
from sandlot.server.service import SandboxService
from sandlot.server.snapshots import SnapshotService
from sandlot.server.store import SandboxStore
from sandlot.server.store.pools import PoolStore
from sandlot.server.store.snapshots import SnapshotStore
from sandlot.server.store.templates import TemplateStore
from sandlot.server.templates import TemplateService
from sandlot.server.tenancy.authn import Authenticator
from sandlot.server.tenancy.principal import SYSTEM, acting_as
from sandlot.server.tenancy.setup import authenticators_for
from sandlot.server.tokens import ExecdTokens, load_or_create_secret


def create_app(cfg: Config, runtime: Runtime) -> FastAPI:
    """Build the app; the store opens and the runtime is reconciled in its lifespan.

    The runtime is owned by the caller (it outlives the app in tests and is closed by
    ``run_server``). The data dir must have passed ``datadir.prepare``.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokens = ExecdTokens(load_or_create_secret(cfg.data_dir))
        store = await SandboxStore.open(cfg.store_url)
        service = SandboxService(cfg, runtime, store, tokens)
        snapshots = SnapshotService(runtime, SnapshotStore(store.engine))
        service.snapshots = snapshots
        pools = PoolService(runtime, PoolStore(store.engine), service.pool_allocated)
        service.pools = pools
        app.state.pools = pools
        templates = TemplateService(service, snapshots, TemplateStore(store.engine))
        service.templates = templates
        app.state.templates = templates

        def pool_snapshot(kind: str, ref: str) -> str:
            with acting_as(SYSTEM):  # a pool is shared: its source is not a tenant's lookup
                if kind == "template":
                    return templates.snapshot_for(ref)[0]
                return snapshots.ready(ref).id

        pools.snapshot_of = pool_snapshot
        app.state.service = service
        app.state.snapshots = snapshots
        app.state.proxy_clients = proxy.ProxyClients(service)
        await observability.start(app, service, store)
        await open_sessions(app, store)
        try:
            await snapshots.start()
            await service.start()
            observability.run()
            await templates.start()  # before the pools: a pool may start from a template
            await pools.start()
            await build_routes(app.router)  # every router and route is in place by now
            yield
        finally:
            await templates.stop()
            await snapshots.stop()
            await service.stop()
            await observability.stop()
            await app.state.proxy_clients.close()
            await store.close()

    app = FastAPI(
        title="sandlot lifecycle API",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    app.include_router(meta.router)
    app.include_router(diagnostics.downloads_router)
    if cfg.metrics.enabled:
        app.include_router(prometheus.router)
    for prefix in ("/v1", ""):
        app.include_router(snapshots_api.router, prefix=prefix)
        app.include_router(pools_api.router, prefix=prefix)
        app.include_router(templates_api.router, prefix=prefix)
        app.include_router(sandboxes.router, prefix=prefix)
        app.include_router(networkpolicy.router, prefix=prefix)
        app.include_router(diagnostics.router, prefix=prefix)
        app.include_router(proxy.router, prefix=prefix)
        app.include_router(sdk_metrics.router, prefix=prefix)
    # Who a request acts for: [server] api_key (the admin) and the tenants file's keys; more
    # authenticators (e.g. a console session) may be appended to app.state.authenticators.
    authenticators: list[Authenticator] = authenticators_for(cfg)
    app.state.authenticators = authenticators
    # Added after the key check, so it runs inside it: only authenticated bodies are read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.server.max_request_body_bytes)
    # Inside the key check: unauthenticated requests are neither counted nor traced.
    observability = Observability.create(app, cfg)
    app.add_middleware(ApiKeyMiddleware, authenticators=authenticators,
                       extra_public=frozenset({"/metrics"}) if cfg.metrics.open else frozenset(),
                       sessions=install_console(app, cfg))
    return app
