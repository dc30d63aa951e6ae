"""What each route of the agent server needs: open, any key, or a scope (docs/security.md).

Declared once, here, for the guard (:func:`conch.web.common.auth.guard_routes`) that checks
it after routing; a route this table does not name is admin-only, and a declaration that
names no route stops the server from starting. ``admits``: the route admits the request
against the key's limits itself, together with its run.
"""

from __future__ import annotations

from conch.keys.scopes import (
    APPROVE,
    EXECUTE,
    INFERENCE,
    MARKETPLACE_PUBLISH,
    ORCHESTRATION,
    SESSIONS,
)
from conch.web.common.auth import ANY, OPEN, Declarations, Rule

RUN = Rule(EXECUTE, admits=True)
_O = "/api/v1/orchestration"
_M = "/api/v1/marketplace"

DECLARATIONS = Declarations(
    {
        ("GET", "/health"): OPEN,
        # Not tenant data: the language, the documents, the caller's own usage.
        ("GET", "/api-docs/openapi.json"): ANY,
        ("GET", "/api/v1/builtins"): ANY,
        ("GET", "/api/v1/builtins/{name}"): ANY,
        ("GET", "/api/v1/types"): ANY,
        ("GET", "/api/v1/schema"): ANY,
        ("GET", "/api/v1/schema/{format}"): ANY,
        ("GET", "/api/v1/usage"): ANY,
        # The server's own load (requests, memory, counts of runs and tasks, no names): as
        # /v1/status on the inference server.
        ("GET", "/api/v1/status/history"): ANY,
        # Runs.
        ("POST", "/api/v1/execute"): RUN,
        ("POST", "/api/v1/eval"): RUN,
        ("POST", "/api/v1/call/{builtin}"): RUN,
        ("POST", "/api/v1/pipeline"): RUN,
        ("POST", "/api/v1/stream/execute"): RUN,
        ("POST", "/api/v1/stream/eval"): RUN,
        ("POST", "/api/v1/stream/pipeline"): RUN,
        ("POST", "/api/v1/analyse"): EXECUTE,
        # MCP: its tools run programs; an agent tool also needs orchestration (checked there).
        ("GET", "/mcp"): EXECUTE,
        ("POST", "/mcp"): EXECUTE,
        ("DELETE", "/mcp"): EXECUTE,
        # Orchestration: the caller's tenant's agents, tasks, threads and workflows.
        ("GET", f"{_O}/agents"): ORCHESTRATION,
        ("POST", f"{_O}/agents"): ORCHESTRATION,
        ("GET", f"{_O}/agents/{{agent_id}}"): ORCHESTRATION,
        ("DELETE", f"{_O}/agents/{{agent_id}}"): ORCHESTRATION,
        ("POST", f"{_O}/tasks"): ORCHESTRATION,
        ("GET", f"{_O}/tasks"): ORCHESTRATION,
        ("GET", f"{_O}/tasks/{{task_id}}"): ORCHESTRATION,
        ("POST", f"{_O}/tasks/{{task_id}}/cancel"): ORCHESTRATION,
        ("GET", f"{_O}/tasks/{{task_id}}/events"): ORCHESTRATION,
        ("GET", f"{_O}/tasks/{{task_id}}/checkpoint"): ORCHESTRATION,
        ("POST", f"{_O}/tasks/{{task_id}}/fork"): ORCHESTRATION,
        # Deciding a pending call: a scope of its own, so that an agent's key cannot.
        ("POST", f"{_O}/tasks/{{task_id}}/approve"): APPROVE,
        ("POST", f"{_O}/tasks/{{task_id}}/reject"): APPROVE,
        ("GET", f"{_O}/threads/{{thread_id}}"): ORCHESTRATION,
        ("POST", f"{_O}/workflows"): ORCHESTRATION,
        ("GET", f"{_O}/workflows"): ORCHESTRATION,
        ("GET", f"{_O}/workflows/{{workflow_id}}"): ORCHESTRATION,
        ("POST", f"{_O}/workflows/{{workflow_id}}/cancel"): ORCHESTRATION,
        ("GET", f"{_O}/workflows/{{workflow_id}}/events"): ORCHESTRATION,
        ("GET", f"{_O}/metrics"): ORCHESTRATION,
        # The marketplace: its catalogue is public to any key; installing is the admin's
        # (installed agents are the server's, for every tenant).
        ("GET", f"{_M}/search"): ANY,
        ("GET", f"{_M}/agents"): ANY,
        ("GET", f"{_M}/agents/{{name}}"): ANY,
        ("POST", f"{_M}/publish"): MARKETPLACE_PUBLISH,
        # The studio's chats on the server: a tenant's conversations with models.
        ("GET", "/api/v1/chats"): INFERENCE,
        ("POST", "/api/v1/chats"): INFERENCE,
        ("POST", "/api/v1/chats/import"): INFERENCE,
        ("GET", "/api/v1/chats/{chat_id}"): INFERENCE,
        ("PATCH", "/api/v1/chats/{chat_id}"): INFERENCE,
        ("DELETE", "/api/v1/chats/{chat_id}"): INFERENCE,
        # Keys, usage of any key and the audit log: admin-only, as every route not named.
    },
    prefixes=[
        # Sessions and their files (their routes are the sessions router's).
        ("/api/v1/sessions", SESSIONS),
    ],
)
