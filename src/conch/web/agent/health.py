"""``GET /health`` (liveness, no key needed), ``GET /metrics`` (Prometheus text) and
``GET /api/v1/status/history`` (the server's figures over the last 15 minutes)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from conch import __version__
from conch.web.agent.deps import HistoryDep, MetricsDep, PoolDep, StartedAtDep
from conch.web.agent.protocol import Health
from conch.web.common.history import HISTORY_ROUTE, HistorySince
from conch.web.common.responses import json_response

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
async def health(started_at: StartedAtDep, pool: PoolDep, detail: bool = False) -> Response:
    """Liveness: `{status: "healthy", version, uptime_seconds}` (no key needed). With
    `?detail=true`, also `sandbox`: its mode and each kernel layer, in force or not, and why."""
    uptime = int(time.monotonic() - started_at)
    body: dict[str, Any] = {"status": "healthy", "version": __version__, "uptime_seconds": uptime}
    if detail:
        body["sandbox"] = {
            "mode": pool.settings.sandbox,
            "layers": {name: layer.to_dict() for name, layer in pool.layers.items()},
        }
    return json_response(body)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def prometheus_metrics(metrics: MetricsDep) -> Response:
    """Prometheus text format."""
    return metrics.response()


@router.get("/api/v1/status/history", description=HISTORY_ROUTE)
async def status_history(history: HistoryDep, since: HistorySince = None) -> Response:
    return json_response(history.to_dict(since))
