"""The inference server: an OpenAI-compatible HTTP API over conch's model store and engines.

``create_app`` only builds the domain objects from settings, puts them on ``app.state`` (the
routers reach them through ``deps``) and includes one router per resource; a route's code is
in the module named after its URL. Generation never runs on the event loop; the engines'
worker threads push tokens to it, so health checks stay fast while streams generate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.middleware import Middleware

import conch
from conch.config import Settings
from conch.inference.acquire import Acquirer
from conch.inference.bundled import ensure_bundled_model
from conch.inference.manager import ModelManager
from conch.inference.providers.registry import ProviderRegistry
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.completions import CompletionServing
from conch.inference.serving.embeddings import EmbeddingServing
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver
from conch.inference.store import ModelStore
from conch.web.common.metrics import MetricsMiddleware
from conch.web.inference import (
    chat,
    completions,
    embeddings,
    health,
    messages,
    models,
    ollama,
    providers,
    responses,
    storage,
)
from conch.web.inference.errors import install_error_handlers
from conch.web.inference.metrics import InferenceMetrics
from conch.web.studio import INFERENCE_PAGES, mount_studio


def create_app(settings: Settings) -> FastAPI:
    store = ModelStore(settings)
    manager = ModelManager(settings, store)
    acquirer = Acquirer(settings, store)
    acquirer.recover()  # forget placeholders of jobs whose process died
    registry = ProviderRegistry(settings, local_models=lambda: _ready_ids(store))
    resolver = ModelResolver(manager, providers=list(registry.providers))
    serving_metrics = ServingMetrics()
    metrics = InferenceMetrics(serving_metrics, manager)
    history = metrics.history()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.ensure_dirs()
        await asyncio.to_thread(ensure_bundled_model, store)
        await registry.start()  # background health probes of the remote providers
        history.start()
        yield
        await history.close()
        await registry.close()
        await manager.unload_all()

    app = FastAPI(
        title="conch inference server",
        version=conch.__version__,
        description="OpenAI-compatible chat completions and embeddings on local GGUF models (llama.cpp) "
        "and ONNX embedding models (onnxruntime), "
        "with a model registry, storage management and providers.",
        openapi_url="/api-docs/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        middleware=[Middleware(MetricsMiddleware, metrics=metrics)],
    )
    state = app.state
    state.settings, state.store, state.manager, state.acquirer = settings, store, manager, acquirer
    state.metrics, state.history = metrics, history
    state.providers = registry
    state.chat = ChatServing(manager, resolver, serving_metrics, providers=registry)
    state.embeddings = EmbeddingServing(manager, resolver, serving_metrics, providers=registry)
    state.completions = CompletionServing(manager, resolver, serving_metrics)
    install_error_handlers(app)
    for module in (chat, embeddings, models, providers, storage, health):
        app.include_router(module.router)
    # The other vendors' APIs, translated onto the same serving layer (docs/apis.md).
    for module in (completions, responses, messages, ollama):
        app.include_router(module.router)
    if settings.enable_openapi:
        app.include_router(health.docs_router)
    mount_studio(app, INFERENCE_PAGES)
    return app


async def _ready_ids(store: ModelStore) -> list[str]:
    records = await asyncio.to_thread(store.list)
    return [r.id for r in records if r.status == "ready"]
