"""OpenTelemetry traces of the create path and of proxied requests.

Off unless ``[tracing] otlp_endpoint`` is set (or a test calls ``enable`` with an exporter
such as the SDK's ``InMemorySpanExporter``): then every API request gets a server span
(``POST /v1/sandboxes``, ``GET /v1/sandboxes/{sandbox_id}/proxy/{port}/{path}``) and a create
adds ``sandbox.create`` > ``sandbox.provision`` > ``runtime.create`` / ``execd.wait_ready``.
Off, the tracer is OpenTelemetry's no-op one: nothing is recorded or allocated per span.

W3C trace context crosses both edges through OpenTelemetry's propagator API: a request's
``traceparent`` (and ``tracestate``/``baggage``) becomes the parent of its server span, and a
proxied request carries the proxy span's own ``traceparent`` into the sandbox
(``propagate_into``), so a service in the sandbox joins the same trace.

The provider is the app's own, not OpenTelemetry's process-global one (several apps may
run in one process, e.g. in tests).
"""

from __future__ import annotations

import time

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandlot import __version__
from sandlot.config import TracingConfig
from sandlot.server.route_template import route_template


class Tracing:
    def __init__(self, cfg: TracingConfig) -> None:
        self.service_name = cfg.service_name
        self._provider: TracerProvider | None = None
        self.tracer: trace.Tracer = trace.NoOpTracer()
        if cfg.otlp_endpoint:
            # Imported only when used: the exporter pulls in protobuf.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.enable(OTLPSpanExporter(endpoint=cfg.otlp_endpoint), batch=True)

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def enable(self, exporter: SpanExporter, batch: bool = False) -> None:
        """Send spans to ``exporter`` (batched in the background, or one by one)."""
        if self._provider is None:
            resource = Resource.create({"service.name": self.service_name,
                                        "service.version": __version__})
            self._provider = TracerProvider(resource=resource)
            self.tracer = self._provider.get_tracer("sandlot.server", __version__)
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


class TracingMiddleware:
    """A server span per HTTP request, named after the route template, when tracing is on."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tracing.enabled:
            await self.app(scope, receive, send)
            return
        tracer = self.tracing.tracer
        start = time.time_ns()
        parent = propagate.extract(_header_carrier(scope))
        with tracer.start_as_current_span(f"{scope['method']} {scope['path']}", context=parent,
                                          kind=SpanKind.SERVER, start_time=start) as span:
            status = 500

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                route = route_template(scope)
                if route:
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.route", str(route))
                span.set_attribute("http.request.method", scope["method"])
                span.set_attribute("url.path", scope["path"])
                span.set_attribute("http.response.status_code", status)
                params = scope.get("path_params") or {}
                if "sandbox_id" in params:
                    span.set_attribute("sandlot.sandbox_id", str(params["sandbox_id"]))
                if "port" in params:
                    span.set_attribute("sandlot.port", str(params["port"]))
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))


def _header_carrier(scope: Scope) -> dict[str, str]:
    """A request's headers as the propagator reads them (lower-case names; a repeated
    header's values joined as HTTP allows)."""
    carrier: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        carrier[name] = f"{carrier[name]},{value}" if name in carrier else value
    return carrier


def propagate_into(headers: list[tuple[str, str]]) -> None:
    """Put the current span's trace context into ``headers`` of a request about to leave
    (replacing the caller's, whose span is this one's parent). Without a recording span
    (tracing off) nothing is injected and the caller's headers pass unchanged."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return
    replaced = {name.lower() for name in carrier}
    headers[:] = [(k, v) for k, v in headers if k.lower() not in replaced]
    headers.extend(carrier.items())
