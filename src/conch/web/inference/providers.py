"""``/v1/providers``: the providers with their probed status, and a validation round trip."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from conch.inference.api.openai import Provider, ProviderValidation
from conch.web.inference.deps import ProvidersDep
from conch.web.inference.openapi import errors

router = APIRouter(tags=["providers"])


@router.get("/v1/providers", response_model=list[Provider], response_model_exclude_none=True)
async def list_providers(registry: ProvidersDep) -> Any:
    """Every provider: `local`, `ollama`, `openai`, `anthropic` and each `[providers.NAME]`;
    `status` from the last background probe, `url` for network providers (never a key)."""
    return registry.listing()


@router.post("/v1/providers/{provider_id}/validate", response_model=ProviderValidation,
             response_model_exclude_none=True, responses=errors())
async def validate_provider(provider_id: str, registry: ProvidersDep) -> Any:
    """A real round trip now (listing the provider's models)."""
    return await registry.validate(provider_id)  # an unknown id: UnknownProvider, a 404
