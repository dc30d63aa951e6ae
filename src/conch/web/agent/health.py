"""``GET /health`` (liveness, no key needed) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.responses import Response

from conch import __version__
from conch.web.agent.deps import MetricsDep, StartedAtDep
from conch.web.agent.protocol import Health
from conch.web.common.responses import json_response

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
async def health(started_at: StartedAtDep) -> Response:
    """Liveness: `{status: "healthy", version, uptime_seconds}` (no key needed)."""
    uptime = int(time.monotonic() - started_at)
    body = {"status": "healthy", "version": __version__, "uptime_seconds": uptime}
    return json_response(body)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def prometheus_metrics(metrics: MetricsDep) -> Response:
    """Prometheus text format."""
    return metrics.response()
