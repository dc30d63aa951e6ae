"""``/v1/health``, ``/v1/status``, ``/metrics``, ``/swagger-ui`` and ``/``: the server about itself.

:class:`RequestCounter` (ASGI middleware) counts every finished request for ``/metrics`` and
``/v1/status``; streams count when they end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse

import conch
from conch.inference.manager import ModelManager
from conch.inference.protocol.openai import Health, Status
from conch.inference.serving.metrics import ServingMetrics
from conch.web.errors import APIError
from conch.web.inference.deps import manager, serving_metrics

router = APIRouter(tags=["health"])
docs_router = APIRouter(include_in_schema=False)


@dataclass
class HttpCounters:
    started: float = field(default_factory=time.time)
    requests: dict[tuple[str, str, int], int] = field(default_factory=dict)
    served: int = 0  # API requests (under /v1/)


class RequestCounter:
    def __init__(self, app: Any, counters: HttpCounters) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def wrapped(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send=wrapped)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            key = (scope.get("method", ""), path, status)
            c = self.counters
            c.requests[key] = c.requests.get(key, 0) + 1
            if path.startswith("/v1/"):
                c.served += 1


def counters(request: Request) -> HttpCounters:
    return request.app.state.http_counters  # type: ignore[no-any-return]


@router.get("/v1/health", response_model=Health)
async def health() -> Any:
    return {"status": "ok"}


@router.get("/v1/status", response_model=Status)
async def status(mgr: ModelManager = Depends(manager), http: HttpCounters = Depends(counters)) -> Any:
    return Status(
        version=conch.__version__,
        uptime_seconds=int(time.time() - http.started),
        providers={"local": "connected"},
        models_loaded=len(mgr.loaded_ids()),
        requests_served=http.served,
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(
    mgr: ModelManager = Depends(manager),
    serving: ServingMetrics = Depends(serving_metrics),
    http: HttpCounters = Depends(counters),
) -> Any:
    return PlainTextResponse(render_metrics(http, serving, mgr), media_type="text/plain; version=0.0.4")


@router.get("/", include_in_schema=False)
async def root() -> JSONResponse:
    return JSONResponse({"name": "conch inference server", "version": conch.__version__, "api": "/v1", "docs": "/swagger-ui"})


@docs_router.get("/swagger-ui", response_class=HTMLResponse)
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/api-docs/openapi.json",
        title="conch inference server",
        swagger_js_url="/swagger-ui/assets/swagger-ui-bundle.js",
        swagger_css_url="/swagger-ui/assets/swagger-ui.css",
        swagger_favicon_url="/swagger-ui/assets/favicon-32x32.png",
    )


@docs_router.get("/swagger-ui/assets/{name}")
async def swagger_asset(name: str) -> FileResponse:
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

    # ``name`` is one path segment (no "/"), so it cannot leave the bundle's directory.
    path = Path(swagger_ui_path) / name
    if name.startswith(".") or not path.is_file():
        raise APIError(404, f"No such asset '{name}'", code="not_found")
    return FileResponse(path)


def render_metrics(http: HttpCounters, m: ServingMetrics, mgr: ModelManager) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value}")

    metric(
        "conch_inference_requests_total", "counter", "HTTP requests served, by method, route and status.",
        [(f'{{method="{k[0]}",route="{k[1]}",status="{k[2]}"}}', v) for k, v in sorted(http.requests.items())],
    )
    metric("conch_inference_prompt_tokens_total", "counter", "Tokens read (prompts and embedding inputs).", [("", m.prompt_tokens)])
    metric("conch_inference_completion_tokens_total", "counter", "Tokens generated.", [("", m.completion_tokens)])
    engines = mgr.engines()
    metric(
        "conch_inference_generated_tokens_total", "counter", "Tokens sampled by the engines (including cancelled streams).",
        [("", sum(e.stats.completion_tokens for e in engines) + mgr.unloaded_completion_tokens)],
    )
    metric("conch_inference_time_to_first_token_seconds", "summary", "Time from request to first generated output.",
           [("_sum", m.ttft_sum), ("_count", m.ttft_count)])
    metric("conch_inference_generation_seconds_total", "counter", "Wall time of completed generations.", [("", m.gen_seconds)])
    metric("conch_inference_tokens_per_second", "gauge", "Decode rate of the last completed generation.", [("", m.last_tokens_per_second)])
    metric("conch_inference_queue_depth", "gauge", "Requests waiting for a free sequence.", [("", sum(e.queued for e in engines))])
    metric("conch_inference_active_sequences", "gauge", "Sequences being generated now.", [("", sum(e.active_sequences for e in engines))])
    metric("conch_inference_models_loaded", "gauge", "Models in memory.", [("", len(engines))])
    metric("conch_inference_embedded_inputs_total", "counter", "Inputs embedded.", [("", m.embedded_inputs)])
    return "\n".join(lines) + "\n"
