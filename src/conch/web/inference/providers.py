"""``/v1/providers``: list the providers and validate one (only ``local`` exists so far)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends

from conch.inference.protocol.openai import Provider, ProviderValidation
from conch.inference.store import ModelStore
from conch.web.errors import APIError
from conch.web.inference.deps import store
from conch.web.inference.responses import errors

router = APIRouter(tags=["providers"])


@router.get("/v1/providers", response_model=list[Provider])
async def list_providers() -> Any:
    return [Provider(id="local", status="available")]


@router.post("/v1/providers/{provider_id}/validate", response_model=ProviderValidation, responses=errors())
async def validate_provider(provider_id: str, models: ModelStore = Depends(store)) -> Any:
    if provider_id != "local":
        raise APIError(404, f"Unknown provider '{provider_id}'; available: local", code="provider_not_found", param="provider_id")
    t0 = time.perf_counter()
    records = await asyncio.to_thread(models.list)
    ready = [r for r in records if r.status == "ready"]
    latency = round((time.perf_counter() - t0) * 1000)
    return ProviderValidation(provider="local", valid=True, latency_ms=latency, models_available=len(ready))
