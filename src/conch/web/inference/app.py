"""The inference server: an OpenAI-compatible HTTP API over conch's model store and engines.

``create_app`` only builds the domain objects from settings (``ServingStack``, the composition
root the in-process client shares), puts them on ``app.state`` (the routers reach them through
``deps``) and includes one router per resource; a route's code is
in the module named after its URL. Generation never runs on the event loop; the engines'
worker threads push tokens to it, so health checks stay fast while streams generate.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.middleware import Middleware

import conch
from conch.config import Settings
from conch.inference.serving.stack import ServingStack
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
    stack = ServingStack(settings)
    stack.acquirer.recover()  # forget placeholders of jobs whose process died
    metrics = InferenceMetrics(stack.metrics, stack.manager)
    history = metrics.history()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await stack.start()
        await stack.providers.start()  # background health probes of the remote providers
        history.start()
        yield
        await history.close()
        await stack.close()

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
    state.settings, state.store, state.manager, state.acquirer = settings, stack.store, stack.manager, stack.acquirer
    state.metrics, state.history = metrics, history
    state.providers = stack.providers
    state.chat, state.embeddings, state.completions = stack.chat, stack.embeddings, stack.completions
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

