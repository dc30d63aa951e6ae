"""Providers in the serving layer: the remote branch of :class:`ChatServing` and
:class:`EmbeddingServing` (the model string picks it before the local path), and the serving
layer of a process that has no server (the shell's ``ai`` and ``embed``).

Provider failures become :class:`ServingError` s here, so routes and callers meet one error
type whichever side answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from conch.inference.remote.base import Provider
from conch.inference.remote.errors import ProviderError
from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.errors import ServingError


def serving_error(exc: ProviderError) -> ServingError:
    return ServingError(exc.status, exc.message, param=exc.param, code=exc.code,
                        type="provider_error" if exc.status >= 500 else None)


def route(registry: ProviderRegistry | None, model: str | None) -> tuple[Provider, str] | None:
    """The provider and its model name for a remote model string; ``None`` for a local one."""
    if registry is None or not model:
        return None
    try:
        return registry.route(model)
    except ProviderError as exc:
        raise serving_error(exc) from None


def request_body(req: Any) -> dict[str, Any]:
    """The OpenAI request as the client sent it (set fields only, wire names)."""
    body: dict[str, Any] = req.model_dump(exclude_unset=True, exclude_none=True, by_alias=True)
    return body


async def chat(provider: Provider, model: str, req: Any) -> dict[str, Any]:
    try:
        return await provider.chat(model, request_body(req))
    except ProviderError as exc:
        raise serving_error(exc) from None


async def chat_stream(provider: Provider, model: str, req: Any) -> AsyncIterator[dict[str, Any]]:
    """Chunks from the provider. Opening the upstream happens at the first ``anext``, so
    whatever goes wrong before the first chunk is raised there (the route's status)."""
    try:
        chunks = await provider.chat_stream(model, request_body(req))
    except ProviderError as exc:
        raise serving_error(exc) from None
    try:
        async for chunk in chunks:
            yield chunk
    except ProviderError as exc:
        raise serving_error(exc) from None
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


async def embed(provider: Provider, model: str, req: Any) -> dict[str, Any]:
    try:
        return await provider.embed(model, request_body(req))
    except ProviderError as exc:
        raise serving_error(exc) from None


class InProcessBackend:
    """Store, engines and providers of this process, as the inference server builds them."""

    def __init__(self, settings: Any) -> None:
        from conch.inference.models.store import ModelStore
        from conch.inference.serving.chat import ChatServing
        from conch.inference.serving.embeddings import EmbeddingServing
        from conch.inference.serving.manager import ModelManager
        from conch.inference.serving.resolve import ModelResolver

        self.settings = settings
        self.store = ModelStore(settings)
        self.manager = ModelManager(settings, self.store)
        self.registry = ProviderRegistry(settings, local_models=self._local_models)
        resolver = ModelResolver(self.manager, providers=list(self.registry.providers))
        self.chat_serving = ChatServing(self.manager, resolver, providers=self.registry)
        self.embedding_serving = EmbeddingServing(self.manager, resolver, providers=self.registry)

    async def _local_models(self) -> list[str]:
        records = await asyncio.to_thread(self.store.list)
        return [r.id for r in records if r.status == "ready"]

    async def start(self) -> None:
        from conch.inference.models.bundled import ensure_bundled_model

        self.settings.ensure_dirs()
        await asyncio.to_thread(ensure_bundled_model, self.store)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        from conch.inference.api.openai import ChatCompletionRequest

        return await _call(self.chat_serving.create, ChatCompletionRequest, body)

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        from conch.inference.api.openai import EmbeddingRequest

        return await _call(self.embedding_serving.create, EmbeddingRequest, body)


async def _call(create: Callable[[Any], Awaitable[dict[str, Any]]], model: Any,
                body: dict[str, Any]) -> dict[str, Any]:
    """``body`` validated into the request ``model`` and answered by ``create``; any failure
    is the :class:`ModelCallError` a caller of the HTTP server would get."""
    from pydantic import ValidationError

    from conch.inference.client import ModelCallError

    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ModelCallError(400, f"invalid request: {where}: {first.get('msg')}") from None
    try:
        return await create(req)
    except ServingError as exc:
        raise ModelCallError(exc.status, exc.message, exc.code) from None
