"""The agent server's Prometheus series, on top of the shared request counter: run durations,
active runs, idle workers and sandbox worker restarts.

Pool figures are read when scraped rather than pushed from the sandbox, which knows nothing
of Prometheus. The same figures, with the orchestration's tasks, sampled by the server every
2 s, are its status history (:meth:`AgentMetrics.history`, ``GET /api/v1/status/history``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from conch.sandbox.pool import SandboxPool
from conch.web.common.history import Figure, Reading, StatusHistory, resident_memory_bytes
from conch.web.common.metrics import HTTPMetrics

log = logging.getLogger(__name__)

FIGURES = (
    Figure("requests_per_s", "counter", "req/s",
           "API requests (monitoring routes and requests marked X-Conch-Poll left out)"),
    Figure("active_tasks", "gauge", "tasks", "Agent tasks pending or running"),
    Figure("waiting_tasks", "gauge", "tasks", "Agent tasks waiting for a person"),
    Figure("sandbox_runs", "gauge", "runs", "Runs executing in the sandbox now"),
    Figure("resident_memory_bytes", "gauge", "bytes", "This process's resident memory"),
)

_RUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


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
        layers = GaugeMetricFamily(
            "conch_sandbox_layer",
            "Kernel layers of the sandbox workers: 1 in force, 0 missing or off",
            labels=["layer"],
        )
        for name, layer in self.pool.layers.items():
            layers.add_metric([name], 1 if layer.active else 0)
        yield layers


class AgentMetrics(HTTPMetrics):
    def __init__(self, pool: SandboxPool) -> None:
        super().__init__()
        self.run_seconds = Histogram(
            "conch_run_duration_seconds",
            "Duration of sandbox runs by kind of request",
            ["kind"],
            buckets=_RUN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(pool))
        self.pool = pool
        self._runs: dict[str, Any] = {}

    def observe_run(self, kind: str, started: float) -> None:
        child = self._runs.get(kind)
        if child is None:
            child = self._runs[kind] = self.run_seconds.labels(kind)
        child.observe(time.perf_counter() - started)

    def history(self, tasks: Callable[[], Awaitable[dict[str, int]]] | None) -> StatusHistory:
        """The server's status history (module doc); ``tasks`` gives the orchestration's
        figures (``active_tasks``, ``waiting_tasks``), None without orchestration."""

        async def read() -> Reading:
            figures: dict[str, int] = {}
            if tasks is not None:
                try:
                    figures = await tasks()
                except Exception:  # the database away: the other figures are still true
                    log.warning("status history: the orchestration's figures could not be read", exc_info=True)
            return {
                "requests_per_s": self.traffic,
                "active_tasks": figures.get("active_tasks"),
                "waiting_tasks": figures.get("waiting_tasks"),
                "sandbox_runs": self.pool.active,
                "resident_memory_bytes": resident_memory_bytes(),
            }

        return StatusHistory(FIGURES, read)
