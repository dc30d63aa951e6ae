"""``/v1/storage``: what the model store holds on disk, and cleanup of caches and leftovers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from conch.inference.api.openai import CleanupResult, StorageStats
from conch.web.inference.deps import StoreDep

router = APIRouter(tags=["storage"])


@router.get("/v1/storage/stats", response_model=StorageStats)
async def storage_stats(models: StoreDep) -> Any:
    s = await asyncio.to_thread(models.stats)
    return StorageStats(**s.model_dump())


@router.post("/v1/storage/cleanup", response_model=CleanupResult)
async def storage_cleanup(models: StoreDep) -> Any:
    freed, removed = await asyncio.to_thread(models.cleanup)
    return CleanupResult(freed_bytes=freed, removed=removed)
