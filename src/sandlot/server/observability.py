"""Diagnostics, metrics and traces wired to one app: built in ``create_app`` and its lifespan.

Kept here so ``app.py`` only calls ``Observability.create`` / ``start`` / ``stop``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import FastAPI

from sandlot.config import Config
from sandlot.server.diagnostic_downloads import DiagnosticDownloads
from sandlot.server.diagnostics import DiagnosticsService
from sandlot.server.event_recorder import EventRecorder
from sandlot.server.metrics import RequestMetricsMiddleware, ServerMetrics
from sandlot.server.sandbox_monitor import SandboxMonitor
from sandlot.server.service import SandboxService
from sandlot.server.store import SandboxStore
from sandlot.server.store.events import EventStore
from sandlot.server.tracing import Tracing, TracingMiddleware


@dataclass
class Observability:
    cfg: Config
    tracing: Tracing
    metrics: ServerMetrics
    monitor: SandboxMonitor | None = None
    recorder: EventRecorder | None = None
    diagnostics: DiagnosticsService | None = field(default=None)

    @classmethod
    def create(cls, app: FastAPI, cfg: Config) -> Observability:
        """Make the parts that exist before the lifespan (middleware) and add them to ``app``."""
        found = cls(cfg, Tracing(cfg.tracing), ServerMetrics(cfg.metrics.per_sandbox))
        if cfg.metrics.enabled:
            app.add_middleware(RequestMetricsMiddleware, metrics=found.metrics)
        app.add_middleware(TracingMiddleware, tracing=found.tracing)
        app.state.observability = found
        return found

    async def start(self, app: FastAPI, service: SandboxService, store: SandboxStore) -> None:
        """Attach to the service (before it starts, so restarts are recorded too)."""
        service.tracing = self.tracing
        def owner_of(sandbox_id: str) -> str | None:
            rec = service.record(sandbox_id)
            return rec.owner if rec is not None else None

        self.recorder = EventRecorder(EventStore(store), owner_of)
        d = self.cfg.diagnostics
        self.monitor = SandboxMonitor(service, self.recorder, d.sample_interval_seconds,
                                      d.retention_seconds)
        # Payloads delivered by URL may be larger than inline ones: collect up to that.
        collect = d.max_inline_bytes if d.delivery == "inline" else max(d.max_inline_bytes,
                                                                        d.max_url_bytes)
        self.diagnostics = DiagnosticsService(service, self.recorder, self.monitor, collect)
        service.observers.add(self.recorder)
        service.observers.add(self.diagnostics)
        self.metrics.attach(service, self.monitor)
        app.state.diagnostics = self.diagnostics
        app.state.diagnostic_downloads = DiagnosticDownloads(d.url_ttl_seconds)
        app.state.monitor = self.monitor

    def run(self) -> None:
        """Start sampling (once the service has started)."""
        if self.monitor is not None:
            self.monitor.start()

    async def stop(self) -> None:
        if self.monitor is not None:
            await self.monitor.stop()
        if self.recorder is not None:
            await self.recorder.close()
        self.tracing.shutdown()
