"""How a router reaches the agent server's domain objects.

``app.create_app`` builds every domain object once from the settings and puts it on
``app.state`` under a fixed name. A route never reads ``app.state`` itself: it declares a
parameter typed with one of the ``Annotated`` aliases below, and FastAPI hands it the object.
A new domain object gets a getter and an alias here, next to the others::

    get_pool = state_getter("pool", SandboxPool)

    PoolDep = Annotated[SandboxPool, Depends(get_pool)]

    @router.get("/api/v1/thing")
    async def thing(pool: PoolDep) -> ...: ...
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from conch.config import Settings
from conch.marketplace import MarketplaceService
from conch.orchestration.service import Orchestrator
from conch.sandbox.pool import SandboxPool
from conch.sessions.runtime import SessionRuntime
from conch.sessions.service import SessionService
from conch.web.agent.metrics import AgentMetrics
from conch.web.agent.runs import Runs
from conch.web.common.deps import state_getter
from conch.web.common.history import StatusHistory

get_settings = state_getter("settings", Settings)
get_pool = state_getter("pool", SandboxPool)
get_metrics = state_getter("metrics", AgentMetrics)
get_runs = state_getter("runs", Runs)
# ``time.monotonic()`` when the app was built (for ``uptime_seconds``).
get_started_at = state_getter("started_at", float)
get_marketplace = state_getter("marketplace", MarketplaceService)
get_orchestrator = state_getter("orchestrator", Orchestrator)
get_history = state_getter("history", StatusHistory)
get_sessions = state_getter("sessions", SessionService)
get_session_runtime = state_getter("session_runtime", SessionRuntime)


SettingsDep = Annotated[Settings, Depends(get_settings)]
PoolDep = Annotated[SandboxPool, Depends(get_pool)]
MetricsDep = Annotated[AgentMetrics, Depends(get_metrics)]
RunsDep = Annotated[Runs, Depends(get_runs)]
StartedAtDep = Annotated[float, Depends(get_started_at)]
MarketplaceDep = Annotated[MarketplaceService, Depends(get_marketplace)]
OrchestratorDep = Annotated[Orchestrator, Depends(get_orchestrator)]
HistoryDep = Annotated[StatusHistory, Depends(get_history)]
SessionsDep = Annotated[SessionService, Depends(get_sessions)]
SessionRuntimeDep = Annotated[SessionRuntime, Depends(get_session_runtime)]
