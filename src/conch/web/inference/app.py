"""The inference server: an OpenAI-compatible HTTP API over conch's model store and engines.

``create_app`` only builds the domain objects from settings (``ServingStack``, the composition
root the in-process client shares), puts them on ``app.state`` (the routers reach them through
``deps``) and includes one router per resource; a route's code is
in the module named after its URL. Generation never runs on the event loop; the engines'
worker threads push tokens to it, so health checks stay fast while streams generate.

Keys (docs/security.md): the guard authenticates every request (``Authorization: Bearer``,
or ``x-api-key`` on ``/v1/messages``) against the keys the agent server shares through the
database, each route's scope is declared in ``scopes.py``, and refusals answer in the
envelope of the API at the path (OpenAI's, Anthropic's, Ollama's, the Responses API's).
A non-loopback bind needs an admin key, as the agent server's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.middleware import Middleware

import conch
from conch.config import Settings
from conch.errors import DomainError
from conch.inference.serving.stack import ServingStack
from conch.web.common.auth import KeyAccess, guard_routes
from conch.web.common.errors import openai_error_body
from conch.web.common.metrics import MetricsMiddleware
from conch.web.common.responses import compact_json
from conch.web.common.security import SecurityMiddleware, check_bind
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
from conch.web.inference.errors import (
    ANTHROPIC,
    OLLAMA,
    OPENAI,
    RESPONSES,
    Envelope,
    install_error_handlers,
)
from conch.web.inference.metrics import InferenceMetrics
from conch.web.inference.scopes import DECLARATIONS
from conch.web.studio import INFERENCE_PAGES, mount_studio


def envelope_at(path: str) -> Envelope:
    """The error envelope of the API a path belongs to (for refusals made before routing)."""
    if path.startswith("/api/"):
        return OLLAMA
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1/responses"):
        return RESPONSES
    return OPENAI


def _refusal(path: str, exc: DomainError) -> bytes:
    return compact_json(envelope_at(path).body(exc)).encode()


def create_app(settings: Settings) -> FastAPI:
    """The inference server app. Raises ``ConfigurationError`` for a non-loopback bind
    without an admin key."""
    check_bind(settings.models_host, settings.api_key, settings.admin_key)
    stack = ServingStack(settings)
    stack.acquirer.recover()  # forget placeholders of jobs whose process died
    metrics = InferenceMetrics(stack.metrics, stack.manager)
    history = metrics.history()
    access = KeyAccess.from_settings(settings, metrics.registry)

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
        middleware=[
            Middleware(MetricsMiddleware, metrics=metrics),
            Middleware(
                SecurityMiddleware,
                api_key=None,
                # No Host guard (the inference server never had one: Ollama clients and
                # other machines' proxies name it as they like); keys guard it instead.
                loopback_only=False,
                max_body_bytes=None,
                error_body=openai_error_body,
                open_paths=DECLARATIONS.open_paths(),
                open_prefixes=DECLARATIONS.open_prefixes(),
                access=access,
                render=_refusal,
            ),
        ],
    )
    state = app.state
    state.settings, state.store, state.manager, state.acquirer = settings, stack.store, stack.manager, stack.acquirer
    state.metrics, state.history = metrics, history
    state.access = access
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
    # Last: every route is in place.
    guard_routes(app, DECLARATIONS)
    return app

