"""Orchestration routes of the agent server: agents, tasks, workflows, their event streams
and metrics (``/api/v1/orchestration/...``).

Routes validate, call the :class:`~conch.orchestration.service.Orchestrator` found at
``app.state.orchestrator`` and shape the answer; domain errors carry their HTTP status.
Each route acts as the request's principal: what it makes belongs to the key's tenant, what
it reads is that tenant's (every tenant's for the admin), and a decision on a pending call
goes to the audit log with the deciding key.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field

from conch.config import Settings
from conch.orchestration.approvals import ApprovalPolicy, Effect
from conch.orchestration.errors import Invalid
from conch.orchestration.executor import make_executor
from conch.orchestration.service import Orchestrator, RunKind
from conch.orchestration.spec import TaskRequest, parse_workflow
from conch.orchestration.task_run import TaskSessions
from conch.orchestration.turns import TASK_ERRORS
from conch.sandbox.pool import SandboxPool
from conch.web.agent.deps import OrchestratorDep
from conch.web.agent.metrics import AgentMetrics
from conch.web.agent.protocol import parse_body
from conch.web.common.auth import KeyAccess, PrincipalDep
from conch.web.common.errors import WebError
from conch.web.common.responses import json_response
from conch.web.common.sse import EventStreamResponse, encode_event
from conch.worker_process import run_on_dask_worker

PREFIX = "/api/v1/orchestration"
router = APIRouter(prefix=PREFIX, tags=["orchestration"])


class AgentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)
    system_prompt: str = ""
    tools: list[str]
    model: str | None = None
    description: str = ""
    approvals: ApprovalPolicy | None = None


class ApproveRequest(BaseModel):
    """Approve a waiting task's pending call (the body is optional)."""

    model_config = ConfigDict(extra="forbid")

    args: dict[str, Any] | None = Field(
        default=None, description="Run the call with these arguments instead of the model's."
    )
    call_id: str | None = Field(
        default=None, description="Which pending call (required when several are pending)."
    )


class RejectRequest(BaseModel):
    """Reject a waiting task's pending call (the body is optional)."""

    model_config = ConfigDict(extra="forbid")

    message: str | None = Field(
        default=None, description="What the model is told instead of the call's result."
    )
    call_id: str | None = Field(
        default=None, description="Which pending call (required when several are pending)."
    )


class ForkRequest(BaseModel):
    """Start a new task from a task's checkpoint (the original is not changed)."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: int = Field(
        ge=0,
        description="Keep steps 0..checkpoint-1 of the task (its history up to step "
        "`checkpoint`); the fork's first new model request is step `checkpoint`. From 0 to "
        "the number of recorded steps (less the final answer's).",
    )
    tool_result: str | None = Field(
        default=None,
        description="Replaces the observation of the last kept step's tool call "
        "(needs checkpoint >= 1).",
    )
    message: str | None = Field(
        default=None,
        min_length=1,
        description="A user message added after the kept steps, before the next model request.",
    )
    max_steps: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="The fork's step budget, kept steps included (default: the original's).",
    )
    thread_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Start this new thread with the fork (`409` if the thread has tasks).",
    )


# -- the task record, as the OpenAPI document describes it (the routes return plain JSON) --

TaskStatus = Literal["pending", "running", "waiting", "succeeded", "failed", "cancelled"]


class PendingCall(BaseModel):
    call_id: str
    tool: str
    args: dict[str, Any]
    effect: Effect
    reason: str = Field(description="Why it waits: the policy's rule, or an interruption.")


class StepCall(BaseModel):
    call_id: str
    tool: str
    args: dict[str, Any]
    observation: str
    error: dict[str, Any] | None


class TaskStep(BaseModel):
    index: int
    action: str = Field(description='The tool called (the first, for several), or "final".')
    args: dict[str, Any]
    observation: str | None
    error: dict[str, Any] | None
    elapsed_ms: int
    usage: dict[str, int]
    calls: list[StepCall] | None = Field(
        default=None,
        description="Native protocol: every tool call of this model turn (run concurrently); "
        "`action`, `args`, `observation` and `error` repeat the first one's.",
    )


class TaskRecord(BaseModel):
    id: str
    goal: str
    tools: list[str]
    max_steps: int
    agent: str
    model: str
    status: TaskStatus = Field(
        description="pending -> running -> succeeded | failed | cancelled; running <-> "
        "waiting (a tool call waits for approval: see `pending`)."
    )
    steps: list[TaskStep]
    result: Any = None
    error: dict[str, Any] | None = Field(
        default=None, description="`{kind, message, hint?, ...}`, `kind` one of "
        + ", ".join(f"`{k}` ({v})" for k, v in TASK_ERRORS.items())
        + "; reason `interrupted` when the task's checkpoint could not be read back after "
        "its server stopped."
    )  # fmt: skip
    created_at: str
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    usage: dict[str, int]
    pending: list[PendingCall] = Field(description="The calls waiting for a decision.")
    approvals: ApprovalPolicy = Field(description="The task's resolved approval policy.")
    approval_timeout_s: float | None
    approval_deadline: str | None = Field(
        description="When the pending calls are rejected if no one decides."
    )
    thread_id: str | None = Field(
        default=None, description="The thread whose conversation the task continues."
    )
    forked_from: str | None = Field(default=None, description="The task it was forked from.")
    fork_checkpoint: int | None = Field(
        default=None, description="The fork kept the original's steps 0..fork_checkpoint-1."
    )
    protocol: Literal["native", "json"] | None = Field(
        description="The tool-call protocol the task runs with: the model API's tools "
        "(native) or JSON actions (json); null until it starts, unless the request forced one."
    )
    session: str | None = Field(
        default=None, description="The session its tool calls run in (given, or its "
        "thread's); absent for a task without one."
    )


class ThreadRecord(BaseModel):
    id: str
    tasks: list[TaskRecord] = Field(description="The thread's tasks, oldest first.")


class CheckpointEntry(BaseModel):
    seq: int
    kind: Literal["model", "call", "result", "ask", "decision", "message"]
    data: dict[str, Any]
    created_at: str


async def _call(coro: Any, status: int = 200) -> Response:
    return json_response(await coro, status)


def _last_event_id(request: Request, last_event_id: int | None) -> int:
    header = request.headers.get("last-event-id")
    if header is not None:
        try:
            return max(0, int(header))
        except ValueError:
            raise WebError(400, "Last-Event-ID: an event number is required") from None
    return max(0, last_event_id or 0)


def _stream(orch: Orchestrator, stream: str, after: int, deltas: bool) -> EventStreamResponse:
    async def chunks() -> AsyncGenerator[bytes, None]:
        # Live-only events (seq None) go without an ``id:`` line: a client's Last-Event-ID
        # stays the last stored event's, which is where a reconnection resumes.
        async for seq, name, data in orch.events(stream, after, deltas=deltas):
            yield encode_event(data, event=name, id=seq)

    return EventStreamResponse(chunks())


def _schema_body(model: type[BaseModel]) -> dict[str, Any]:
    """The request body of a route that reads it with ``parse_body`` (any Content-Type)."""
    return {"requestBody": {"content": {"application/json": {"schema": model.model_json_schema()}}}}


_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: start, step, complete | error (with id: lines); "
        "a task's also interrupt and resume, and with `?deltas=true` the live-only model_start, "
        "delta, model_end, model_retry and delta_gap (no id: lines, never replayed)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

_Record = Coroutine[Any, Any, Any]


def _runs(
    kind: RunKind,
    get: Callable[[Orchestrator, str, str | None], _Record],
    cancel: Callable[[Orchestrator, str, str | None], _Record],
    *,
    cancelled: str,
    record: type[BaseModel] | None = None,
) -> None:
    """The routes tasks and workflows have alike: list, get, cancel and the event stream,
    under ``/{kind}s`` with the path parameter ``{kind}_id``."""
    plural, param = f"/{kind}s", f"{kind}_id"
    item = f"{plural}/{{{param}}}"

    async def list_runs(
        orch: OrchestratorDep,
        principal: PrincipalDep,
        status: str | None = Query(default=None),
        limit: int = Query(default=100, ge=1, le=1000),
        offset: int = Query(default=0, ge=0),
    ) -> Response:
        return await _call(orch.list_runs(kind, status, limit, offset, principal.reads))

    # The path parameter is named per kind (``task_id``), for the URL templates and the
    # OpenAPI document alike.
    async def get_run(
        orch: OrchestratorDep, principal: PrincipalDep, run_id: str = Path(alias=param)
    ) -> Response:
        return await _call(get(orch, run_id, principal.reads))

    async def cancel_run(
        orch: OrchestratorDep, principal: PrincipalDep, run_id: str = Path(alias=param)
    ) -> Response:
        return await _call(cancel(orch, run_id, principal.reads))

    async def run_events(
        orch: OrchestratorDep,
        request: Request,
        principal: PrincipalDep,
        run_id: str = Path(alias=param),
        last_event_id: int | None = Query(default=None),
        deltas: bool = Query(
            default=False,
            description="Tasks only: the model's turns as they are generated too (`model_start`, "
            "`delta`, `model_end`, `model_retry`), live and never stored: no `id:` line, not "
            "replayed on a reconnection.",
        ),
    ) -> Response:
        if deltas and kind != "task":
            raise Invalid("deltas: only a task's event stream has model deltas", where="deltas")
        after = _last_event_id(request, last_event_id)
        await _call(get(orch, run_id, principal.reads))
        return _stream(orch, f"{kind}:{run_id}", after, deltas)

    one: dict[int | str, dict[str, Any]] = {}
    many: dict[int | str, dict[str, Any]] = {}
    if record is not None:
        one = {200: {"model": record, "description": f"The {kind}."}}
        many = {200: {"model": list[record], "description": f"{kind.capitalize()}s."}}  # type: ignore[valid-type]
    router.add_api_route(
        plural,
        list_runs,
        methods=["GET"],
        name=f"list_{kind}s",
        description=f"{kind.capitalize()}s, newest first (bare array); `?status=` filters.",
        responses=many,
    )
    router.add_api_route(item, get_run, methods=["GET"], name=f"get_{kind}", responses=one)
    router.add_api_route(
        f"{item}/cancel",
        cancel_run,
        methods=["POST"],
        name=f"cancel_{kind}",
        description=cancelled,
        responses=one,
    )
    router.add_api_route(
        f"{item}/events",
        run_events,
        methods=["GET"],
        name=f"{kind}_events",
        description=f"The {kind}'s events; join at any time, resume with `Last-Event-ID`.",
        response_class=Response,
        responses=_SSE_DOC,
    )


# -- agents -------------------------------------------------------------------------------


@router.get("/agents")
async def list_agents(orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """Every agent the key sees (the built-in one, its tenant's and the marketplace's):
    `{id, status, capabilities, model, description}` (bare array)."""
    return await _call(orch.list_agents(principal.reads))


@router.post("/agents", status_code=201, openapi_extra=_schema_body(AgentRequest))
async def register_agent(request: Request, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """Register (or replace) an agent `{id, system_prompt, tools, model}` of the key's tenant
    (`409` for an id another tenant uses)."""
    body = await parse_body(request, AgentRequest)
    created = orch.register_agent(**body.model_dump(), owner=principal.owner, tenant=principal.reads)
    return await _call(created, 201)


@router.get("/agents/{agent_id}")
async def get_agent(agent_id: str, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    return await _call(orch.get_agent(agent_id, principal.reads))


@router.delete("/agents/{agent_id}")
async def delete_agent(agent_id: str, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    async def remove() -> dict[str, Any]:
        await orch.remove_agent(agent_id, principal.reads)
        return {"id": agent_id, "deleted": True}

    return await _call(remove())


# -- tasks --------------------------------------------------------------------------------


@router.post("/tasks", status_code=201, openapi_extra=_schema_body(TaskRequest))
async def create_task(request: Request, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """Create a task `{goal, tools, max_steps, agent?, model?, thread_id?, protocol?}`; it
    runs in the background. With `thread_id` it continues the conversation of the thread's
    last task (`409` while a task of the thread is still pending, running or waiting)."""
    body = await parse_body(request, TaskRequest)
    created = orch.create_task(**body.model_dump(), owner=principal.owner, key_id=principal.key_id)
    return await _call(created, 201)


_runs(
    "task",
    Orchestrator.get_task,
    Orchestrator.cancel_task,
    cancelled="Cancel a pending, running or waiting task; `409` once it has finished.",
    record=TaskRecord,
)


async def _optional_body(request: Request, model: type[BaseModel]) -> Any:
    """The body as ``model``; an empty body is the model's defaults."""
    if not (await request.body()).strip():
        return model()
    return await parse_body(request, model)


_DECISION_ERRORS: dict[int | str, dict[str, Any]] = {
    200: {"model": TaskRecord, "description": "The task, running again (or still waiting "
          "when other calls are pending)."},
    400: {"description": "Bad body: `error.where` names the field (`args.<param>`, "
          "`call_id`)."},
    404: {"description": "No such task."},
    409: {"description": "The task is not waiting for an approval."},
}  # fmt: skip


@router.post(
    "/tasks/{task_id}/approve",
    openapi_extra=_schema_body(ApproveRequest),
    responses=_DECISION_ERRORS,
)
async def approve_task(
    task_id: str, request: Request, orch: OrchestratorDep, principal: PrincipalDep
) -> Response:
    """Approve a waiting task's pending call, optionally with edited `args` (and `call_id`
    when several are pending); the task resumes. Needs the `approve` scope; recorded in the
    audit log with the key and the edited arguments."""
    body = await _optional_body(request, ApproveRequest)
    decided = orch.approve_task(task_id, args=body.args, call_id=body.call_id,
                                tenant=principal.reads, actor=principal)  # fmt: skip
    return await _call(decided)


@router.post(
    "/tasks/{task_id}/reject",
    openapi_extra=_schema_body(RejectRequest),
    responses=_DECISION_ERRORS,
)
async def reject_task(
    task_id: str, request: Request, orch: OrchestratorDep, principal: PrincipalDep
) -> Response:
    """Reject a waiting task's pending call: the model sees `message` as the call's result
    and the task goes on. Needs the `approve` scope; recorded in the audit log."""
    body = await _optional_body(request, RejectRequest)
    decided = orch.reject_task(task_id, message=body.message, call_id=body.call_id,
                               tenant=principal.reads, actor=principal)  # fmt: skip
    return await _call(decided)


@router.get(
    "/tasks/{task_id}/checkpoint",
    responses={200: {"model": list[CheckpointEntry], "description": "The entries, in order."}},
)
async def task_checkpoint(task_id: str, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """The task's checkpoint: every model reply and tool call as it completed, and every
    approval asked for and decided (what a restarted server resumes it from)."""
    return await _call(orch.task_checkpoint(task_id, principal.reads))


@router.post(
    "/tasks/{task_id}/fork",
    status_code=201,
    openapi_extra=_schema_body(ForkRequest),
    responses={
        201: {"model": TaskRecord, "description": "The new task (`forked_from`, "
              "`fork_checkpoint`), running from the kept steps."},
        400: {"description": "Bad body: `error.where` names the field (`checkpoint` out of "
              "range or not in the checkpoint, `tool_result` with no call to replace, "
              "`max_steps` not above `checkpoint`, unknown fields)."},
        404: {"description": "No such task."},
        409: {"description": "`thread_id` names a thread that has tasks."},
    },
)  # fmt: skip
async def fork_task(
    task_id: str, request: Request, orch: OrchestratorDep, principal: PrincipalDep
) -> Response:
    """Start a new task from a checkpoint of this one (any status, running included): the
    history up to step `checkpoint`, optionally with the last kept tool result replaced and a
    user message added. Kept model turns and tool calls are replayed from the copied
    checkpoint, not asked or run again; the original stays as it was."""
    body = await parse_body(request, ForkRequest)
    forked = orch.fork_task(task_id, **body.model_dump(), tenant=principal.reads,
                            owner=principal.owner, key_id=principal.key_id)  # fmt: skip
    return await _call(forked, 201)


# -- threads ------------------------------------------------------------------------------


@router.get(
    "/threads/{thread_id}",
    responses={
        200: {"model": ThreadRecord, "description": "The thread's tasks, oldest first."},
        404: {"description": "No task has this thread_id."},
    },
)
async def get_thread(thread_id: str, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """A thread `{id, tasks}`: the tasks created with this `thread_id`, oldest first (the
    key's tenant's thread of that id)."""
    return await _call(orch.get_thread(thread_id, principal.reads))


# -- workflows ----------------------------------------------------------------------------


@router.post("/workflows", status_code=201)
async def create_workflow(request: Request, orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """Create and start a workflow (a DAG of `run` and `task` steps)."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise Invalid(f"body: not JSON ({exc})", where="body") from None
    req = parse_workflow(data)
    return await _call(orch.create_workflow(req, principal.owner, principal.key_id), 201)


_runs(
    "workflow",
    Orchestrator.get_workflow,
    Orchestrator.cancel_workflow,
    cancelled="Stop running steps, skip pending ones; `409` on a finished workflow.",
)


# -- metrics ------------------------------------------------------------------------------


@router.get("/metrics")
async def metrics(orch: OrchestratorDep, principal: PrincipalDep) -> Response:
    """`{total_agents, active_tasks, completed_tasks, avg_task_duration_ms, failed_tasks,
    cancelled_tasks, total_workflows, running_workflows, waiting_tasks}` of the key's tenant
    (of every tenant for the admin)."""
    return await _call(orch.metrics(principal.reads))


class OrchestrationCollector(Collector):
    """The metrics route's figures in Prometheus /metrics (read when scraped)."""

    GAUGES = (
        "total_agents",
        "active_tasks",
        "waiting_tasks",
        "running_workflows",
        "avg_task_duration_ms",
    )

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        figures = self.orch.stores.metrics()
        figures["total_agents"] = figures.pop("registered_agents") + 1
        for key, value in figures.items():
            name = f"conch_orchestration_{key}"
            if key in self.GAUGES:
                yield GaugeMetricFamily(
                    name, f"Orchestration: {key.replace('_', ' ')}", value=value
                )
            else:
                yield CounterMetricFamily(
                    name, f"Orchestration: {key.replace('_', ' ')}", value=value
                )


# How long a task's model pass lives; a new one is issued once half of it has passed.
PASS_S = 900.0


def build(
    settings: Settings,
    pool: SandboxPool,
    metrics: AgentMetrics,
    access: KeyAccess | None = None,
    sessions: TaskSessions | None = None,
) -> Orchestrator:
    """The orchestrator of the app (started and closed by the app's lifespan); its figures
    join the app's Prometheus registry. With keys (``access``), a task's model turns carry a
    pass of the key that made it, and decisions on pending calls go to the audit log.
    ``sessions``: where tasks with a session run."""
    credentials = _Passes(access) if access is not None else None
    executor = make_executor(settings, pool, dask_job=run_on_dask_worker)
    orch = Orchestrator(settings, executor, credentials, sessions)
    metrics.registry.register(OrchestrationCollector(orch))
    if access is not None:
        orch.runner.on_decision = _AuditDecisions(access)
    return orch


class _Passes:
    """The model pass of each key whose tasks run here (issued again before it expires)."""

    def __init__(self, access: KeyAccess) -> None:
        self.access = access
        self._passes: dict[str | None, tuple[str | None, float]] = {}

    def __call__(self, key_id: str | None) -> str | None:
        import time

        now = time.monotonic()
        got = self._passes.get(key_id)
        if got is not None and got[1] > now:
            return got[0]
        token = self.access.keys.issue_pass_for(key_id or "admin", PASS_S)
        if len(self._passes) > 10_000:
            self._passes.clear()
        self._passes[key_id] = (token, now + PASS_S / 2)
        return token


class _AuditDecisions:
    """A decision on a pending call, written to the audit log (by which key, with the edited
    arguments); a timeout's has no key."""

    def __init__(self, access: KeyAccess) -> None:
        self.access = access

    def __call__(
        self,
        actor: Any,
        task_id: str,
        item: dict[str, Any],
        decision: str,
        edited: dict[str, Any] | None,
        message: str | None,
    ) -> None:
        self.access.audit.approval_decided(
            actor,
            task_id=task_id,
            call_id=str(item.get("call_id")),
            decision=decision,
            tool=item.get("tool"),
            arguments=item.get("args") if isinstance(item.get("args"), dict) else None,
            edited_arguments=edited,
            reason=message,
        )
