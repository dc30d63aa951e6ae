"""``POST /v1/embeddings``: validate, call :class:`EmbeddingServing`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from conch.inference.api.openai import EmbeddingRequest, EmbeddingResponse, ErrorResponse
from conch.web.inference.deps import EmbeddingDep
from conch.web.inference.metering import meter
from conch.web.inference.openapi import errors

router = APIRouter(tags=["embeddings"])


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingResponse,
    responses={**errors(), 501: {"model": ErrorResponse, "description": "The model's runtime is not installed"}},
)
async def embeddings(req: EmbeddingRequest, serving: EmbeddingDep, request: Request) -> Any:
    return await serving.create(req, meter(request, req.model, serving.providers))
