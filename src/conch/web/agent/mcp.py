"""The MCP endpoint of the agent server: streamable HTTP at ``/mcp``.

A plain route inside the app, so the same guard as every other route applies (Host check on a
loopback bind, bearer key, the ``execute`` scope, body limit). The SDK's own DNS-rebinding
check is therefore off: it would only repeat ours with a narrower list of loopback names.
Each tool call acts as the request's key (:class:`KeyGuard`): its runs are admitted against
the key's limits, and an agent tool needs the ``orchestration`` scope and makes its task as
the key's tenant.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from conch.keys import require_scope
from conch.keys.scopes import ORCHESTRATION
from conch.mcp_server import ConchMCP, OrchestratorRunner
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.pool import Job
from conch.web.agent.runs import Runs
from conch.web.common.auth import PRINCIPAL

PATH = "/mcp"


def attach(app: Any, settings: Any) -> ConchMCP:
    """Serve conch's MCP server at ``/mcp`` of ``app`` (after the marketplace and the
    orchestrator are on ``app.state``)."""
    orchestrator = getattr(app.state, "orchestrator", None)
    server = ConchMCP(
        settings=settings,
        run_job=app.state.pool.run,
        installed=app.state.marketplace.installed,
        run_agent=OrchestratorRunner(orchestrator) if orchestrator is not None else None,
        guard=KeyGuard(app.state.runs),
    )
    manager = StreamableHTTPSessionManager(
        app=server.server,
        # Plain JSON answers: a tool call is one POST and one JSON reply, no event stream.
        json_response=True,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=settings.max_body_bytes,
    )
    app.router.add_route(
        PATH,
        StreamableHTTPASGIApp(manager),
        methods=["GET", "POST", "DELETE"],
        include_in_schema=False,
    )
    app.state.mcp = server
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> Any:
        async with inner(a) as state, manager.run():
            yield state

    app.router.lifespan_context = lifespan
    return server


class KeyGuard:
    """A tool call as the HTTP request's API key (``mcp_server.CallGuard``)."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    async def run(self, request: Any, job: Job) -> RunEnvelope:
        principal = getattr(request, "scope", {}).get(PRINCIPAL)
        return await self.runs.run(job, "mcp", principal)

    def agent(self, request: Any) -> dict[str, Any]:
        principal = getattr(request, "scope", {}).get(PRINCIPAL)
        if principal is None:
            return {}
        require_scope(principal, ORCHESTRATION)
        return {"owner": principal.owner, "key_id": principal.key_id}
