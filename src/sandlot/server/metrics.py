"""Prometheus metrics of the control plane, served at ``GET /metrics``.

One registry per app (tests run several apps in one process). Counters and histograms are
updated as things happen (lifecycle observer, request middleware); gauges that mirror state
(sandboxes by state, warm pools, per-sandbox CPU/memory, endpoint bytes) are read at scrape
time by ``_StateCollector``, so the hot paths pay nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandlot.server.models import SandboxState
from sandlot.server.observers import LifecycleObserver
from sandlot.server.route_template import route_template

if TYPE_CHECKING:
    from sandlot.server.models import SandboxRecord
    from sandlot.server.sandbox_monitor import SandboxMonitor
    from sandlot.server.service import SandboxService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)


class ServerMetrics(LifecycleObserver):
    """The app's metrics; also a lifecycle observer timing creates and deletes."""

    def __init__(self, per_sandbox: bool = True) -> None:
        self.per_sandbox = per_sandbox
        self.registry = CollectorRegistry(auto_describe=True)
        self.create_seconds = Histogram(
            "sandlot_sandbox_create_duration_seconds",
            "Time from a create request to Running (success) or Failed (failure)",
            ["outcome"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.delete_seconds = Histogram(
            "sandlot_sandbox_delete_duration_seconds",
            "Time a delete (or expiry) takes to remove the sandbox",
            ["outcome"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter(
            "sandlot_http_requests", "API requests by route template, method and status",
            ["method", "route", "status"], registry=self.registry)
        self.request_seconds = Histogram(
            "sandlot_http_request_duration_seconds", "API request time to the response's start",
            ["method", "route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.proxy_bytes = Counter(
            "sandlot_proxy_bytes",
            "Bytes relayed by the server proxy (/proxy/{port}): HTTP bodies and WebSocket "
            "message payloads",
            ["direction"], registry=self.registry)
        self.lifecycle_events = Counter(
            "sandlot_sandbox_transitions", "Sandbox state transitions by the state entered",
            ["state"], registry=self.registry)
        self._collector: _StateCollector | None = None
        self._started: dict[str, float] = {}  # sandbox id -> create start
        self._deleting: dict[str, float] = {}  # sandbox id -> delete start

    def attach(self, service: SandboxService, monitor: SandboxMonitor) -> None:
        """Read the live state of ``service`` at scrape time (once it exists)."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _StateCollector(service, monitor, self.per_sandbox)
        self.registry.register(self._collector)
        service.observers.add(self)

    def exposition(self) -> bytes:
        """The text format: this app's metrics, then the process-wide default registry's
        (process CPU/memory, the SDK-reported create latencies)."""
        return generate_latest(self.registry) + generate_latest(REGISTRY)

    # ----- lifecycle -------------------------------------------------------------------

    def transitioned(self, rec: SandboxRecord, before: SandboxState) -> None:
        now = time.monotonic()
        state = rec.state
        self.lifecycle_events.labels(state=state.value).inc()
        if state == before == SandboxState.PENDING:  # a new record
            self._started[rec.id] = now
            return
        started = self._started.pop(rec.id, None) if before == SandboxState.PENDING else None
        if started is not None and state in (SandboxState.RUNNING, SandboxState.FAILED):
            outcome = "success" if state == SandboxState.RUNNING else "failure"
            self.create_seconds.labels(outcome=outcome).observe(now - started)
        if state == SandboxState.STOPPING:
            self._deleting[rec.id] = now
        elif before == SandboxState.STOPPING:
            began = self._deleting.pop(rec.id, None)
            if began is not None:
                outcome = "success" if state == SandboxState.TERMINATED else "failure"
                self.delete_seconds.labels(outcome=outcome).observe(now - began)
        if state == SandboxState.TERMINATED:
            self._started.pop(rec.id, None)


class _StateCollector(Collector):
    """Gauges read from live state at scrape time."""

    def __init__(self, service: SandboxService, monitor: SandboxMonitor,
                 per_sandbox: bool) -> None:
        self.service = service
        self.monitor = monitor
        self.per_sandbox = per_sandbox

    def collect(self) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("sandlot_sandboxes", "Sandboxes by lifecycle state",
                                     labels=["state"])
        counts = dict.fromkeys((s.value for s in SandboxState if s != SandboxState.TERMINATED),
                               0)
        for rec in self.service.records():
            if rec.state != SandboxState.TERMINATED:
                counts[rec.state.value] += 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state

        ready = GaugeMetricFamily("sandlot_warm_pool_ready",
                                  "Pre-started sandboxes ready to be claimed", labels=["pool"])
        claims = CounterMetricFamily("sandlot_warm_pool_claims",
                                     "Creates served by a pre-started sandbox", labels=["pool"])
        misses = CounterMetricFamily("sandlot_warm_pool_misses",
                                     "Creates of a pooled image that found none ready",
                                     labels=["pool"])
        for name, stats in self.service.runtime.warm_pools().items():
            label = name or "default"
            ready.add_metric([label], stats.ready)
            claims.add_metric([label], stats.claims)
            misses.add_metric([label], stats.misses)
        yield ready
        yield claims
        yield misses

        forwarder = self.service.forwarder
        endpoint = CounterMetricFamily("sandlot_endpoint_bytes",
                                       "Bytes relayed by direct endpoints (connections handed "
                                       "over to the sandbox whole are not counted)",
                                       labels=["direction"])
        endpoint.add_metric(["to_sandbox"], forwarder.bytes_in.n)
        endpoint.add_metric(["from_sandbox"], forwarder.bytes_out.n)
        yield endpoint
        yield CounterMetricFamily("sandlot_endpoint_handoffs",
                                  "Direct-endpoint connections handed over to the sandbox whole "
                                  "(execd's port on runc sandboxes) instead of relayed",
                                  value=forwarder.handed_off.n)

        if not self.per_sandbox:
            return
        cpu = CounterMetricFamily("sandlot_sandbox_cpu_seconds",
                                  "CPU time used by the sandbox (last sample)",
                                  labels=["sandbox_id"])
        mem = GaugeMetricFamily("sandlot_sandbox_memory_bytes",
                                "Memory in use by the sandbox (last sample)",
                                labels=["sandbox_id"])
        limit = GaugeMetricFamily("sandlot_sandbox_memory_limit_bytes",
                                  "The sandbox's memory limit", labels=["sandbox_id"])
        ooms = CounterMetricFamily("sandlot_sandbox_oom_kills",
                                   "Processes killed in the sandbox for memory",
                                   labels=["sandbox_id"])
        for sid, sample in self.monitor.samples().items():
            u = sample.usage
            if u.cpu_seconds is not None:
                cpu.add_metric([sid], u.cpu_seconds)
            if u.memory_bytes is not None:
                mem.add_metric([sid], u.memory_bytes)
            if u.memory_limit_bytes is not None:
                limit.add_metric([sid], u.memory_limit_bytes)
            ooms.add_metric([sid], u.oom_kills)
        yield cpu
        yield mem
        yield limit
        yield ooms


class RequestMetricsMiddleware:
    """Counts API requests by route template and status, and the proxy's bytes.

    Pure ASGI (streamed proxy answers pass untouched). The route template (``scope["route"]``
    set by the router) keeps the label set small: ids never become labels.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and "/proxy/" in scope["path"]:
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        counted = [0, 0]  # request body bytes, response body bytes
        is_proxy = "/proxy/" in scope["path"]

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                counted[0] += len(message.get("body", b""))
            return message

        async def send_and_time(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.request_seconds.labels(
                    method=scope["method"], route=_template(scope)
                ).observe(time.perf_counter() - start)
            elif message["type"] == "http.response.body":
                counted[1] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive if is_proxy else receive, send_and_time)
        finally:
            self.metrics.requests.labels(
                method=scope["method"], route=_template(scope), status=str(status)).inc()
            if is_proxy:
                self.metrics.proxy_bytes.labels(direction="to_sandbox").inc(counted[0])
                self.metrics.proxy_bytes.labels(direction="from_sandbox").inc(counted[1])


    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A proxied WebSocket (a terminal, a Jupyter kernel): its messages' payloads are
        counted as they pass, not at the end, so a session open for hours shows on the
        dashboard while it runs."""
        to_sandbox = self.metrics.proxy_bytes.labels(direction="to_sandbox")
        from_sandbox = self.metrics.proxy_bytes.labels(direction="from_sandbox")

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                to_sandbox.inc(_ws_payload_size(message))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "websocket.send":
                from_sandbox.inc(_ws_payload_size(message))
            await send(message)

        await self.app(scope, counting_receive, counting_send)


def _ws_payload_size(message: Message) -> int:
    """Bytes of one WebSocket message's payload (a text frame counts as its UTF-8 bytes)."""
    data = message.get("bytes")
    if data is not None:
        return len(data)
    text = message.get("text")
    return len(text.encode()) if text is not None else 0


def _template(scope: Scope) -> str:
    return route_template(scope) or "unmatched"
