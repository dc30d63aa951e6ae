"""Prometheus metrics for both servers, through ``prometheus_client``.

:class:`HTTPMetrics` owns a registry per app (several apps may live in one process, e.g. in
tests, and a process-wide registry would mix their figures and refuse duplicate names) and
counts requests by route template, method and status. A server subclasses it to add its own
series on ``self.registry``; figures kept by the domain (pool sizes, loaded models) are best
read when scraped, through a ``prometheus_client`` ``Collector``, so the domain never imports
Prometheus.

Each registry also carries the process's own series (``process_resident_memory_bytes``,
``process_cpu_seconds_total``, open file descriptors...: ``ProcessCollector``, read from
``/proc`` when scraped, absent elsewhere) and ``python_info`` (``PlatformCollector``), as the
default registry would; the studio's Status page charts the resident memory of both servers.

Besides the Prometheus series, :attr:`HTTPMetrics.traffic` counts the requests that are
traffic: not a monitoring route, not a CORS preflight, and not marked as a client's polling
(the ``X-Conch-Poll`` header). It is what the status history (:mod:`conch.web.common.history`)
charts as requests per second.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conch.web.common.history import MONITORING_ROUTES, POLL_HEADER

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_MAX_CACHED_LABELS = 1024


class HTTPMetrics:
    """``requests_name``: the request counter's series (``_total`` is added), which dashboards
    already read under each server's own name."""

    def __init__(self, requests_name: str = "conch_http_requests") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.requests = Counter(
            requests_name,
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        # Labelled children by label values: looking one up through ``labels()`` takes a
        # lock and several checks, a sizeable part of serving a small request.
        self._requests: dict[tuple[str, str, int], Any] = {}
        self.traffic = 0  # requests neither monitoring, preflight nor polling (module doc)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def response(self) -> Response:
        return Response(self.render(), media_type=CONTENT_TYPE)

    def count_request(self, route: str, method: str, status: int, polling: bool = False) -> None:
        if not polling and method != "OPTIONS" and route not in MONITORING_ROUTES:
            self.traffic += 1
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

    def __init__(self, app: ASGIApp, metrics: HTTPMetrics) -> None:
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
            self.metrics.count_request(template, scope["method"], status, _polling(scope))


_POLL = POLL_HEADER.encode()


def _polling(scope: Scope) -> bool:
    """Whether the request carries a non-empty ``X-Conch-Poll`` header."""
    return any(name == _POLL and value for name, value in scope["headers"])
