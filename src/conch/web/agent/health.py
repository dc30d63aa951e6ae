"""``GET /health`` (liveness, no key needed) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from conch import __version__
from conch.web.agent.deps import MetricsDep, PoolDep, StartedAtDep
from conch.web.agent.protocol import Health
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
