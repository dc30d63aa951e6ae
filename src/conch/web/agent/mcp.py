"""The MCP endpoint of the agent server: streamable HTTP at ``/mcp``.

A plain route inside the app, so the same guard as every other route applies (Host check on a
loopback bind, bearer key, the ``execute`` scope, body limit). The SDK's own DNS-rebinding
check is therefore off: it would only repeat ours with a narrower list of loopback names.
Each tool call acts as the request's key (:class:`KeyGuard`): its runs are admitted against
the key's limits, and an agent tool needs the ``orchestration`` scope and makes its task as
the key's tenant.

Each MCP client has a conch session of its own (:mod:`conch.mcp_server`, "Sessions"): over
HTTP it is carried by the ``conch_session`` cookie, read here into the request's
:class:`~conch.mcp_server.SessionSlot` and set on the answer that made the session; the
session belongs to the key's tenant and counts against its ``sessions_max``.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from http.cookies import CookieError, SimpleCookie
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from conch.keys import require_scope
from conch.keys.scopes import ORCHESTRATION
from conch.mcp_server import COOKIE, CURRENT_SLOT, ConchMCP, OrchestratorRunner, SessionSlot
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.jobs import Job
from conch.web.agent.runs import Runs
from conch.web.agent.session_access import admit_session
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
        sessions=getattr(app.state, "session_runtime", None),
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
        _with_session_cookie(StreamableHTTPASGIApp(manager)),
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

    async def run(
        self, request: Any, job: Job, session: str | None
    ) -> tuple[RunEnvelope, list[dict[str, str]] | None]:
        principal = getattr(request, "scope", {}).get(PRINCIPAL)
        return await self.runs.run_in(job, "mcp", principal, session)

    def tenant(self, request: Any) -> tuple[str | None, str | None]:
        principal = getattr(request, "scope", {}).get(PRINCIPAL)
        return (None, None) if principal is None else (principal.owner, principal.reads)

    async def made_session(self, request: Any, session_id: str) -> None:
        sessions = self.runs.sessions
        if request is not None and sessions is not None:
            await admit_session(request, session_id, sessions.service.store.existing)

    def agent(self, request: Any) -> dict[str, Any]:
        principal = getattr(request, "scope", {}).get(PRINCIPAL)
        if principal is None:
            return {}
        require_scope(principal, ORCHESTRATION)
        return {"owner": principal.owner, "key_id": principal.key_id}


class _with_session_cookie:  # a class, not a function: Starlette mounts it as an ASGI app
    """``inner`` (the MCP transport) with the client's session carried by a cookie."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        slot = SessionSlot(_cookie(scope))

        async def send_cookie(message: Any) -> None:
            if message["type"] == "http.response.start" and slot.made and slot.id:
                cookie = f"{COOKIE}={slot.id}; Path={PATH}; HttpOnly; SameSite=Strict"
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"set-cookie", cookie.encode())]}
            await send(message)

        token = CURRENT_SLOT.set(slot)
        try:
            await self.inner(scope, receive, send_cookie)
        finally:
            CURRENT_SLOT.reset(token)


def _cookie(scope: Any) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                return None
            morsel = jar.get(COOKIE)
            return morsel.value if morsel is not None else None
    return None
