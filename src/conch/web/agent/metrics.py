"""The agent server's Prometheus series, on top of the shared request counter: run durations,
active runs, idle workers and sandbox worker restarts.

Pool figures are read when scraped rather than pushed from the sandbox, which knows nothing
of Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from conch.sandbox.pool import SandboxPool
from conch.web.common.metrics import HTTPMetrics

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
        self._runs: dict[str, Any] = {}

    def observe_run(self, kind: str, started: float) -> None:
        child = self._runs.get(kind)
        if child is None:
            child = self._runs[kind] = self.run_seconds.labels(kind)
        child.observe(time.perf_counter() - started)
