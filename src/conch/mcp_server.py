"""conch as an MCP server (official ``mcp`` SDK, low-level ``Server``), for any MCP client.

Tools:
- ``execute``: run a conch program in the sandbox (as ``POST /api/v1/execute``);
- every builtin the server's policy allows (its effect is enabled), from the language
  schema's MCP export, called with named arguments (as ``POST /api/v1/call/:name``);
- ``agent-<name>`` for each installed marketplace agent: runs a task with that agent and
  returns its result.

Resources: the language reference (``docs/language.md`` when the source tree ships it), the
language schema and the builtin list, as ``conch://`` URIs; and the files of the client's
session, ``conch://files/{path}``.

Sessions. Each MCP client gets a conch session of its own (``conch.sessions``) on its first
tool call: ``let x = 1`` in one call and ``x + 1`` in the next give 2, and the files a program
writes are there for the next call and as resources. Which client a call comes from is what
the transport can say: over stdio, the process (one client); over HTTP, a cookie
(``conch_session``, set on the answer to the first call: the 2026-07-28 protocol keeps no
session of its own, and an HTTP client keeps cookies), or an older protocol's
``Mcp-Session-Id``. A client that keeps neither may pass ``session`` to ``execute`` (the
session's id is in every result's ``structured_content``).

A conch error (a program's ``PermissionError``, a wrong argument's ``TypeError``, a limit) is
a tool result with ``isError: true`` whose text is ``Kind: message``: the calling model sees
what went wrong and can correct itself; only protocol misuse is a protocol error.

Transport-free: :mod:`conch.web.agent.mcp` serves it over streamable HTTP at ``/mcp`` and
``conch mcp`` over stdio. Over HTTP a :class:`CallGuard` acts for the request's API key: a
tool's run is admitted against the key's limits, and an agent tool needs the key's
``orchestration`` scope; its refusal is the tool's error result.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import mcp.types as types
from mcp.server import Server, ServerRequestContext

from conch import __version__
from conch.config import Settings
from conch.lang import schema
from conch.lang.builtins.registry import lookup
from conch.marketplace.service import InstalledAgent
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.jobs import Job, allowed_effects

if TYPE_CHECKING:
    from conch.sessions.runtime import SessionRuntime

log = logging.getLogger(__name__)

AGENT_PREFIX = "agent-"
DEFAULT_AGENT_STEPS = 10
DOCS_URI = "conch://docs/language"
SCHEMA_URI = "conch://schema"
BUILTINS_URI = "conch://builtins"

FILES_URI = "conch://files/"
COOKIE = "conch_session"
# How many of a session's files its resource list names (the rest: the template).
MAX_LISTED_FILES = 500

RunJob = Callable[[Job], Awaitable[RunEnvelope]]


@dataclass
class SessionSlot:
    """The conch session of the HTTP request being served (:mod:`conch.web.agent.mcp` sets
    one per request from the client's cookie): ``id`` as the client sent it, or as made for
    it (``made``: the answer must set the cookie)."""

    id: str | None = None
    made: bool = False


# The slot of the request in hand, where the transport has one (HTTP); None: stdio.
CURRENT_SLOT: ContextVar[SessionSlot | None] = ContextVar("conch_mcp_session", default=None)


class AgentRunner(Protocol):
    """Runs one task with an installed agent and waits for it (orchestration)."""

    async def __call__(
        self, agent: InstalledAgent, goal: str, max_steps: int, **owner: Any
    ) -> dict[str, Any]:
        """Returns ``{status, result, error}`` of the finished task (``owner``: the task's
        ``owner`` and ``key_id``)."""
        ...


class CallGuard(Protocol):
    """What a tool call may do, for the request it came in (its ``request``: the HTTP
    request, or None over stdio). Raises an error of conch's tree (with ``kind`` and
    ``message``) to refuse."""

    async def run(
        self, request: Any, job: Job, session: str | None
    ) -> tuple[RunEnvelope, list[dict[str, str]] | None]:
        """Run ``job`` for the request (admitted against its key's limits), in ``session``
        when given: its envelope, and the bindings the session could not save."""
        ...

    def tenant(self, request: Any) -> tuple[str | None, str | None]:
        """``(owner, reads)``: the tenant a session made for the request belongs to, and the
        one its reads pass (None: every tenant's)."""
        ...

    async def made_session(self, request: Any, session_id: str) -> None:
        """A session was made for the request: count it against its key's limits (raise to
        refuse; it is then deleted)."""
        ...

    def agent(self, request: Any) -> dict[str, Any]:
        """The request may run an agent's task: the task's owner fields (``owner``,
        ``key_id``)."""
        ...


class OrchestratorRunner:
    """An agent tool's call as an orchestration task: created with the agent (its tools,
    prompt and model) and awaited; the MCP client waits as long as the task runs."""

    def __init__(self, orchestrator: Any) -> None:
        self.orchestrator = orchestrator

    async def __call__(
        self, agent: InstalledAgent, goal: str, max_steps: int, **owner: Any
    ) -> dict[str, Any]:
        try:
            task = await self.orchestrator.create_task(
                goal=goal, tools=None, max_steps=max_steps, agent=agent.name, **owner
            )
        except Exception as exc:
            if not hasattr(exc, "kind"):
                raise
            return {"status": "failed", "error": {"kind": exc.kind, "message": str(exc)}}
        done: dict[str, Any] = await self.orchestrator.wait_task(task["id"])
        return done


@dataclass
class ConchMCP:
    settings: Settings
    run_job: RunJob
    installed: Callable[[], Sequence[InstalledAgent]]
    run_agent: AgentRunner | None = None
    guard: CallGuard | None = None
    # Where a client's calls keep their state (None: every call is stateless)
    sessions: SessionRuntime | None = None
    _by_client: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _making: asyncio.Lock | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        effects = allowed_effects(self.settings)
        self.builtin_tools: dict[str, types.Tool] = {}
        for spec in schema.mcp_tools()["tools"]:
            b = lookup(spec["name"])
            if b is not None and b.effect in effects:
                self.builtin_tools[spec["name"]] = types.Tool.model_validate(spec)
        self.execute_tool = types.Tool(
            name="execute",
            title="Run conch code",
            description=(
                "Run a conch program (a typed, pipeline-oriented shell language) in the server's "
                "sandbox and return its value rendered as text. Example: "
                '`ls("src") | where(fn(f) => f.size > 1kb) | .name`. Read the resource '
                f"{DOCS_URI} for the language."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "conch source"},
                    "session": {"type": "string", "description": (
                        "the session to run in (its id is in every result's structured "
                        "content); by default the client's own, kept between calls")},
                },
                "required": ["command"],
            },
            annotations=types.ToolAnnotations(title="execute", open_world_hint=False),
        )
        self.server: Server[Any] = Server(
            "conch",
            version=__version__,
            instructions=(
                "conch runs programs of its shell language in a sandbox confined to a "
                "workspace. Use `execute` for code, a builtin tool for one call, or an "
                "`agent-*` tool to hand a goal to an installed agent."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
            on_list_resource_templates=self._list_resource_templates,
        )
        # The SDK wraps every message in an OpenTelemetry span by default; conch installs no
        # exporter, so nothing would read them, and each call would still pay for one.
        self.server.middleware.clear()

    # -- tools ----------------------------------------------------------------------------

    def _agent_tools(self) -> dict[str, tuple[types.Tool, InstalledAgent]]:
        if self.run_agent is None:
            return {}
        out = {}
        for agent in self.installed():
            name = AGENT_PREFIX + agent.name
            tool = types.Tool(
                name=name,
                title=f"{agent.name} {agent.version}",
                description=f"{agent.description} (conch agent {agent.name}@{agent.version}; "
                f"tools: {', '.join(agent.tools) or 'none'})",
                input_schema={
                    "type": "object",
                    "properties": {
                        "goal": {"type": "string", "description": "what the agent should do"},
                        "max_steps": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 100,
                            "default": DEFAULT_AGENT_STEPS,
                        },
                    },
                    "required": ["goal"],
                },
                annotations=types.ToolAnnotations(title=agent.name, open_world_hint=True),
            )
            out[name] = (tool, agent)
        return out

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [self.execute_tool, *self.builtin_tools.values()]
        tools += [tool for tool, _ in self._agent_tools().values()]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = params.arguments or {}
        name = params.name
        request = getattr(ctx, "request", None)
        try:
            if name == "execute":
                command = args.get("command")
                if not isinstance(command, str):
                    return _error("TypeError", "execute needs a string argument `command`")
                given = args.get("session")
                if given is not None and (not isinstance(given, str) or self.sessions is None):
                    return _error("TypeError", "session must be the string id of a session"
                                  if self.sessions is not None else "this server runs no sessions")
                return await self._run(ctx, Job("program", source=command), given)
            if name in self.builtin_tools:
                return await self._run(ctx, Job("call", builtin=name, kwargs=args))
            if name.startswith(AGENT_PREFIX):
                entry = self._agent_tools().get(name)
                if entry is not None:
                    owner = self.guard.agent(request) if self.guard is not None else {}
                    return await self._call_agent(entry[1], args, owner)
        except Exception as exc:  # a refusal of the guard or a session's (conch's error tree)
            kind, message = getattr(exc, "kind", None), getattr(exc, "message", None)
            if kind is None or message is None:
                raise
            return _error(str(kind), str(message))
        return _error("NameError", f"unknown tool {name!r}")

    async def _run_job(
        self, request: Any, job: Job, session: str | None
    ) -> tuple[RunEnvelope, list[dict[str, str]] | None]:
        """``job`` as the request's key (through the guard), in ``session`` when given."""
        if self.guard is not None:
            return await self.guard.run(request, job, session)
        if session is not None:
            assert self.sessions is not None
            return await self.sessions.run(session, job)
        return await self.run_job(job), None

    async def _call_agent(
        self, agent: InstalledAgent, args: dict[str, Any], owner: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        assert self.run_agent is not None
        goal = args.get("goal")
        steps = args.get("max_steps", DEFAULT_AGENT_STEPS)
        if not isinstance(goal, str) or not goal.strip():
            return _error("TypeError", "an agent needs a non-empty string argument `goal`")
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 100:
            return _error("TypeError", "max_steps must be an integer from 1 to 100")
        task = await self.run_agent(agent, goal, steps, **(owner or {}))
        if task.get("status") != "succeeded":
            err = task.get("error")
            if isinstance(err, dict):
                return _error(str(err.get("kind", "AgentError")), str(err.get("message", "")))
            return _error("AgentError", f"task {task.get('status')}: {err or 'no result'}")
        result = task.get("result")
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content={"task_id": task.get("id"), "result": result},
        )

    # -- sessions -------------------------------------------------------------------------

    async def _run(self, ctx: ServerRequestContext[Any], job: Job,
                   given: str | None = None) -> types.CallToolResult:
        """Run ``job`` in the client's session (or ``given``), statelessly without sessions."""
        request = getattr(ctx, "request", None)
        if self.sessions is None:
            return _from_envelope((await self._run_job(request, job, None))[0])
        session = given or await self._session_of(ctx, make=True)
        assert session is not None
        done, unsaved = await self._run_job(request, job, session)
        result = _from_envelope(done)
        if isinstance(result.structured_content, dict):
            result.structured_content = {**result.structured_content, "session": session,
                                         **({"unsaved": unsaved} if unsaved else {})}
        return result

    def _client_key(self, ctx: ServerRequestContext[Any]) -> str | None:
        """The client as the transport knows it (not over a cookie: see :meth:`_session_of`)."""
        request = ctx.request
        headers = getattr(request, "headers", None)
        if headers is not None:
            legacy = headers.get("mcp-session-id")
            return f"mcp:{legacy}" if legacy else None
        return "process"  # stdio: one client per process

    async def _session_of(self, ctx: ServerRequestContext[Any], *, make: bool) -> str | None:
        """The conch session of the client this request comes from (made if ``make``)."""
        assert self.sessions is not None
        service = self.sessions.service
        slot = CURRENT_SLOT.get()
        key = self._client_key(ctx)
        known = slot.id if slot is not None and slot.id else (
            self._by_client.get(key) if key is not None else None)
        owner, reads = self.guard.tenant(ctx.request) if self.guard is not None else (None, None)
        if known is not None:
            try:
                await asyncio.to_thread(service.get, known, tenant=reads)
                return known
            except Exception:  # gone (expired, deleted): the client gets a new one
                known = None
        if not make:
            return None
        if self._making is None:
            self._making = asyncio.Lock()
        async with self._making:
            if key is not None and self._by_client.get(key) not in (None, known):
                return self._by_client[key]
            made = await asyncio.to_thread(service.create, tenant=owner)
            if self.guard is not None:
                try:
                    await self.guard.made_session(ctx.request, made.id)
                except BaseException:  # over the key's sessions_max: as if never made
                    await self.sessions.delete(made.id)
                    raise
        if slot is not None:
            slot.id, slot.made = made.id, True
        elif key is not None:
            self._by_client[key] = made.id
        return made.id

    # -- resources ------------------------------------------------------------------------

    def _docs_path(self) -> Path | None:
        import conch

        path = Path(conch.__file__).resolve().parents[2] / "docs" / "language.md"
        return path if path.is_file() else None

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        resources = []
        if self._docs_path() is not None:
            resources.append(
                types.Resource(
                    uri=DOCS_URI,
                    name="language",
                    title="The conch language reference",
                    mime_type="text/markdown",
                )
            )
        resources += await self._file_resources(ctx)
        resources += [
            types.Resource(
                uri=SCHEMA_URI,
                name="schema",
                title="The conch language schema (types, builtins, syntax)",
                mime_type="application/json",
            ),
            types.Resource(
                uri=BUILTINS_URI,
                name="builtins",
                title="Every builtin: name, description, category",
                mime_type="application/json",
            ),
        ]
        return types.ListResourcesResult(resources=resources)

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        docs = self._docs_path()
        if uri == DOCS_URI and docs is not None:
            text, mime = docs.read_text(encoding="utf-8"), "text/markdown"
        elif uri == SCHEMA_URI:
            text, mime = (
                json.dumps(schema.language_schema(), ensure_ascii=False),
                "application/json",
            )
        elif uri == BUILTINS_URI:
            text, mime = json.dumps(schema.builtins(), ensure_ascii=False), "application/json"
        elif uri.startswith(FILES_URI) and self.sessions is not None:
            return await self._read_file(ctx, uri)
        else:
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown resource {uri!r}")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type=mime)]
        )


    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = []
        if self.sessions is not None:
            templates.append(types.ResourceTemplate(
                uri_template=FILES_URI + "{path}", name="files",
                title="A file of this client's session's workspace",
            ))
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _file_resources(self, ctx: ServerRequestContext[Any]) -> list[types.Resource]:
        """The files of the client's session (none before its first call)."""
        if self.sessions is None:
            return []
        session = await self._session_of(ctx, make=False)
        if session is None:
            return []
        service = self.sessions.service

        def walk() -> list[dict[str, Any]]:
            files = service.files(session)
            found: list[dict[str, Any]] = []
            dirs = ["."]
            while dirs and len(found) < MAX_LISTED_FILES:
                for entry in files.list(dirs.pop(0)):
                    if entry["type"] == "dir":
                        dirs.append(entry["name"])
                    elif entry["type"] == "file":
                        found.append(entry)
            return found[:MAX_LISTED_FILES]

        from conch.sessions.files import content_type

        return [
            types.Resource(uri=FILES_URI + entry["name"], name=entry["name"],
                           mime_type=content_type(entry["name"]), size=entry["size"])
            for entry in await asyncio.to_thread(walk)
        ]

    async def _read_file(self, ctx: ServerRequestContext[Any], uri: str) -> types.ReadResourceResult:
        from mcp.shared.exceptions import MCPError

        from conch.sessions.errors import SessionError

        assert self.sessions is not None
        session = await self._session_of(ctx, make=False)
        if session is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown resource {uri!r}: this "
                           "client has no session yet")
        service = self.sessions.service
        path = uri[len(FILES_URI):]

        def read() -> tuple[bytes, str]:
            with service.files(session).get(path) as opened:
                return opened.file.read(opened.size), opened.content_type

        try:
            data, mime = await asyncio.to_thread(read)
        except SessionError as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"{uri}: {exc.message}") from None
        try:
            content: types.TextResourceContents | types.BlobResourceContents = \
                types.TextResourceContents(uri=uri, text=data.decode("utf-8"), mime_type=mime)
        except UnicodeDecodeError:
            content = types.BlobResourceContents(
                uri=uri, blob=base64.b64encode(data).decode("ascii"), mime_type=mime)
        return types.ReadResourceResult(contents=[content])


def _error(kind: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"{kind}: {message}")],
        is_error=True,
        structured_content={"kind": kind, "message": message},
    )


def _from_envelope(done: RunEnvelope) -> types.CallToolResult:
    err = done.error
    if not done.success or err is not None:
        if err is None:
            return _error("Error", "the run failed without an error")
        message = err.message
        if err.line is not None and f"line {err.line}" not in message:
            message += f" at line {err.line}, column {err.column}"
        return _error(err.kind, message)
    printed = list(done.output)
    result = done.result
    text = "\n".join([*printed, "" if result is None else result]).strip("\n")
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content={"result": result, "type": done.type, "output": printed},
    )
