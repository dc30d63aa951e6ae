"""The agent and code-execution server (``conch serve``): builds the domain objects from the
settings, puts them on ``app.state`` (routers reach them through ``deps.py``) and includes one
router per resource. Its routes are documented in docs/agent-server.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.middleware import Middleware

from conch import __version__
from conch.chats import ChatStore
from conch.config import Settings
from conch.lang.builtins.registry import load_all
from conch.sandbox.pool import SandboxPool
from conch.sessions.runtime import SessionRuntime
from conch.sessions.service import SessionService
from conch.sessions.tasks import TaskSessions
from conch.web.agent import (
    analysis,
    chats,
    discovery,
    execution,
    health,
    keys,
    marketplace,
    mcp,
    orchestration,
    sessions,
    streams,
)
from conch.web.agent.errors import agent_error_bytes, install_error_handlers
from conch.web.agent.fast_path import AgentApp
from conch.web.agent.metrics import AgentMetrics
from conch.web.agent.runs import Runs
from conch.web.agent.scopes import DECLARATIONS
from conch.web.common.auth import KeyAccess, guard_routes
from conch.web.common.errors import agent_error_body
from conch.web.common.metrics import MetricsMiddleware
from conch.web.common.security import (
    ConfigurationError,
    SecurityMiddleware,
    check_bind,
    is_loopback,
)
from conch.web.studio import ALL_PAGES, mount_studio

__all__ = ["ConfigurationError", "create_app"]


def create_app(settings: Settings, pool: SandboxPool | None = None) -> AgentApp:
    """The agent server app. Raises :class:`ConfigurationError` for an unsafe configuration."""
    check_bind(settings.host, settings.api_key, settings.admin_key)
    load_all()
    pool = pool or SandboxPool(settings)
    metrics = AgentMetrics(pool)
    access = KeyAccess.from_settings(settings, metrics.registry)
    session_service = SessionService.from_settings(settings)
    session_runtime = SessionRuntime(session_service, pool)

    @asynccontextmanager
    async def lifespan(app: AgentApp) -> AsyncIterator[None]:
        await pool.start()
        await session_runtime.start()
        await app.state.orchestrator.start()
        app.state.history.start()
        try:
            yield
        finally:
            await app.state.history.close()
            await app.state.orchestrator.close()
            await session_runtime.close()
            await pool.close()

    # Outermost first; the fast path goes through the very same stack.
    middleware = [
        Middleware(MetricsMiddleware, metrics=metrics),
        Middleware(
            SecurityMiddleware,
            api_key=settings.api_key,
            loopback_only=is_loopback(settings.host),
            max_body_bytes=settings.max_body_bytes,
            error_body=agent_error_body,
            open_paths=DECLARATIONS.open_paths(),
            open_prefixes=DECLARATIONS.open_prefixes(),
            access=access,
            render=lambda _path, exc: agent_error_bytes(exc),
            body_exempt=sessions.is_upload,
        ),
    ]
    app = AgentApp(
        title="conch agent server",
        version=__version__,
        description="Runs conch code over HTTP, streams results, publishes the language schema.",
        openapi_url="/api-docs/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        middleware=middleware,
    )
    app.state.settings = settings
    app.state.started_at = time.monotonic()
    app.state.pool = pool
    app.state.metrics = metrics
    app.state.access = access
    app.state.chats = ChatStore(access.keys.engine)
    app.state.sessions = session_service
    app.state.session_runtime = session_runtime
    app.state.runs = runs = Runs(pool, metrics, access, session_runtime)
    app.state.orchestrator = orchestrator = orchestration.build(
        settings, pool, metrics, access, TaskSessions(session_runtime))
    pool.recorder = orchestrator.record_builtin
    app.state.history = metrics.history(orchestrator.active_counts)

    install_error_handlers(app)
    for module in (execution, streams, analysis, discovery, health, orchestration, sessions, keys, chats):
        app.include_router(module.router)
    marketplace.attach(app, settings)
    mcp.attach(app, settings)
    mount_studio(app, ALL_PAGES)
    # Last: every route is in place, and the fast path takes its routes' guards.
    guard_routes(app, DECLARATIONS)
    app.serve_fast(runs, middleware, execution.router.routes)
    return app
