"""``/v1/health``, ``/v1/status``, ``/v1/status/history``, ``/metrics``, ``/swagger-ui`` and ``/``:
the server about itself.

Requests are counted for ``/metrics`` and ``/v1/status`` by the shared middleware
(:mod:`conch.web.common.metrics`) into :class:`~conch.web.inference.metrics.InferenceMetrics`;
streams count when they end.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse

import conch
from conch.inference.api.openai import DeviceStatus, Health, MemoryStatus, Status
from conch.inference.engines.llama.device import device_info
from conch.inference.serving.errors import NotFound
from conch.web.common.history import HISTORY_ROUTE, HistorySince
from conch.web.inference.deps import HistoryDep, ManagerDep, MetricsDep, ProvidersDep

router = APIRouter(tags=["health"])
docs_router = APIRouter(include_in_schema=False)


@router.get("/v1/health", response_model=Health)
async def health() -> Any:
    return {"status": "ok"}


@router.get("/v1/status", response_model=Status)
async def status(mgr: ManagerDep, metrics: MetricsDep, registry: ProvidersDep) -> Any:
    where = await asyncio.to_thread(device_info)  # nvidia-smi may take tens of milliseconds
    return Status(
        version=conch.__version__,
        uptime_seconds=int(time.time() - metrics.started),
        providers=registry.status_map(),
        models_loaded=len(mgr.loaded_ids()),
        requests_served=metrics.served,
        device=DeviceStatus.model_validate(where.as_dict()),
        memory=MemoryStatus(budget_bytes=mgr.budget.bytes, used_bytes=mgr.used_bytes(), free_bytes=mgr.free_bytes(),
                            basis=mgr.budget.basis),
    )


@router.get("/v1/status/history", description=HISTORY_ROUTE)
async def status_history(history: HistoryDep, since: HistorySince = None) -> Any:
    return history.to_dict(since)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(series: MetricsDep) -> Any:
    where = await asyncio.to_thread(device_info)
    return series.response_for(where)


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
        raise NotFound(f"No such asset '{name}'")
    return FileResponse(path)
