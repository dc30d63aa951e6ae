"""FastAPI dependencies: the domain objects ``create_app`` put on ``app.state``.

A route names what it needs (``chat: ChatServing = Depends(chat_serving)``) and never builds
domain objects itself, so every router can be mounted on any app built by ``create_app``.
"""

from __future__ import annotations

from fastapi import Request

from conch.config import Settings
from conch.inference.acquire import Acquirer
from conch.inference.manager import ModelManager
from conch.inference.providers.registry import ProviderRegistry
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.embeddings import EmbeddingServing
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.store import ModelStore


async def settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def store(request: Request) -> ModelStore:
    return request.app.state.store  # type: ignore[no-any-return]


async def manager(request: Request) -> ModelManager:
    return request.app.state.manager  # type: ignore[no-any-return]


async def acquirer(request: Request) -> Acquirer:
    return request.app.state.acquirer  # type: ignore[no-any-return]


async def chat_serving(request: Request) -> ChatServing:
    return request.app.state.chat  # type: ignore[no-any-return]


async def embedding_serving(request: Request) -> EmbeddingServing:
    return request.app.state.embeddings  # type: ignore[no-any-return]


async def serving_metrics(request: Request) -> ServingMetrics:
    return request.app.state.serving_metrics  # type: ignore[no-any-return]


async def providers(request: Request) -> ProviderRegistry:
    return request.app.state.providers  # type: ignore[no-any-return]
