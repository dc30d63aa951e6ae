"""Prometheus metrics of the agent server: requests by route and status, run durations,
active runs and sandbox worker restarts.

Each app has its own registry (several apps may live in one process, e.g. in tests); pool
figures are read when scraped rather than pushed from the sandbox, which knows nothing of
Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conch.agents.sandbox import SandboxPool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_MAX_CACHED_LABELS = 1024


class _PoolCollector(Collector):
    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        active = GaugeMetricFamily("conch_active_runs", "Runs executing in the sandbox now")
        active.add_metric([], self.pool.active)
        yield active
        idle = GaugeMetricFamily("conch_sandbox_idle_workers", "Sandbox workers waiting for a run")
        idle.add_metric([], self.pool.idle)
        yield idle
        restarts = CounterMetricFamily(
            "conch_worker_restarts",
            "Sandbox workers killed and replaced, by reason",
            labels=["reason"],
        )
        for reason in ("timeout", "limit", "crash", "cancelled", "protocol", "recycle"):
            restarts.add_metric([reason], self.pool.restarts.get(reason, 0))
        yield restarts


class AgentMetrics:
    def __init__(self, pool: SandboxPool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "conch_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.run_seconds = Histogram(
            "conch_run_duration_seconds",
            "Duration of sandbox runs by kind of request",
            ["kind"],
            buckets=(
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
                5,
                10,
                30,
                60,
                300,
            ),
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(pool))
        # Labelled children by label values: looking one up through ``labels()`` takes a
        # lock and several checks, a sizeable part of serving a small request.
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._runs: dict[str, Any] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_run(self, kind: str, started: float) -> None:
        child = self._runs.get(kind)
        if child is None:
            child = self._runs[kind] = self.run_seconds.labels(kind)
        child.observe(time.perf_counter() - started)

    def count_request(self, route: str, method: str, status: int) -> None:
        key = (route, method, status)
        child = self._requests.get(key)
        if child is None:
            child = self.requests.labels(route, method, str(status))
            if len(self._requests) < _MAX_CACHED_LABELS:  # methods come from clients
                self._requests[key] = child
        child.inc()


class MetricsMiddleware:
    """Counts every response (including those the security guard refuses) by the route
    template it matched, so that paths with parameters do not explode the label set."""

    def __init__(self, app: ASGIApp, metrics: AgentMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            route: BaseRoute | None = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.count_request(template, scope["method"], status)
