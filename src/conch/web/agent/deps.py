"""How a router reaches the agent server's domain objects.

``app.create_app`` builds every domain object once from the settings and puts it on
``app.state`` under a fixed name. A route never reads ``app.state`` itself: it declares a
parameter typed with one of the ``Annotated`` aliases below, and FastAPI hands it the object.
A new domain object gets a getter and an alias here, next to the others::

    def get_pool(request: Request) -> SandboxPool:
        return cast(SandboxPool, request.app.state.pool)

    PoolDep = Annotated[SandboxPool, Depends(get_pool)]

    @router.get("/api/v1/thing")
    async def thing(pool: PoolDep) -> ...: ...
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from conch.agents.sandbox import SandboxPool
from conch.config import Settings
from conch.web.agent.metrics import AgentMetrics
from conch.web.agent.runs import Runs


def get_settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


def get_pool(request: Request) -> SandboxPool:
    return cast(SandboxPool, request.app.state.pool)


def get_metrics(request: Request) -> AgentMetrics:
    return cast(AgentMetrics, request.app.state.metrics)


def get_runs(request: Request) -> Runs:
    return cast(Runs, request.app.state.runs)


def get_started_at(request: Request) -> float:
    """``time.monotonic()`` when the app was built (for ``uptime_seconds``)."""
    return cast(float, request.app.state.started_at)


SettingsDep = Annotated[Settings, Depends(get_settings)]
PoolDep = Annotated[SandboxPool, Depends(get_pool)]
MetricsDep = Annotated[AgentMetrics, Depends(get_metrics)]
RunsDep = Annotated[Runs, Depends(get_runs)]
StartedAtDep = Annotated[float, Depends(get_started_at)]
