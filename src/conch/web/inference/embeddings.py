"""``POST /v1/embeddings``: validate, call :class:`EmbeddingServing`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from conch.inference.protocol.openai import EmbeddingRequest, EmbeddingResponse, ErrorResponse
from conch.inference.serving.embeddings import EmbeddingServing
from conch.web.inference.deps import embedding_serving
from conch.web.inference.responses import errors

router = APIRouter(tags=["embeddings"])


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingResponse,
    responses={**errors(), 501: {"model": ErrorResponse, "description": "The model's runtime is not installed"}},
)
async def embeddings(req: EmbeddingRequest, serving: EmbeddingServing = Depends(embedding_serving)) -> Any:
    return await serving.create(req)
