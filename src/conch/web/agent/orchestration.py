"""Orchestration routes of the agent server: agents, tasks, workflows, their event streams
and metrics (``/api/v1/orchestration/...``).

Routes validate, call the :class:`~conch.orchestration.service.Orchestrator` found at
``app.state.orchestrator`` and shape the answer; domain errors carry their HTTP status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conch.agents.sandbox import SandboxPool
from conch.config import Settings
from conch.orchestration.errors import Invalid, OrchestrationError
from conch.orchestration.executor import make_executor
from conch.orchestration.service import Orchestrator
from conch.orchestration.spec import TaskRequest, WorkflowRequest, parse_workflow
from conch.web.common.errors import agent_error_body
from conch.web.common.sse import EventStreamResponse, encode_event

PREFIX = "/api/v1/orchestration"
router = APIRouter(prefix=PREFIX, tags=["orchestration"])


class AgentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)
    system_prompt: str = ""
    tools: list[str]
    model: str | None = None
    description: str = ""


def orchestrator(request: Request) -> Orchestrator:
    return request.app.state.orchestrator  # type: ignore[no-any-return]


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json")


def _error(exc: OrchestrationError) -> Response:
    extra = {"where": exc.where} if exc.where else {}
    return Response(
        agent_error_body(exc.status, exc.message, kind=exc.kind, **extra),
        exc.status,
        media_type="application/json",
    )


M = TypeVar("M", bound=BaseModel)


async def _parse(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise Invalid(f"body: not JSON ({exc})", where="body") from None
    if not isinstance(data, dict):
        raise Invalid("body: a JSON object is required", where="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise Invalid(f"{where}: {err['msg']}", where=where) from None


async def _call(coro: Any, status: int = 200) -> Response:
    try:
        return _json(await coro, status)
    except OrchestrationError as exc:
        return _error(exc)


def _last_event_id(request: Request, last_event_id: int | None) -> int:
    header = request.headers.get("last-event-id")
    if header is not None:
        try:
            return max(0, int(header))
        except ValueError:
            raise Invalid(
                "Last-Event-ID: an event number is required", where="Last-Event-ID"
            ) from None
    return max(0, last_event_id or 0)


def _stream(orch: Orchestrator, stream: str, after: int) -> EventStreamResponse:
    async def chunks() -> AsyncGenerator[bytes, None]:
        async for seq, name, data in orch.events(stream, after):
            yield encode_event(data, event=name, id=seq)

    return EventStreamResponse(chunks())


_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: start, step, complete | error (with id: lines)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

# -- agents -------------------------------------------------------------------------------


@router.get("/agents")
async def list_agents(orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Every agent: `{id, status, capabilities, model, description}` (bare array)."""
    return await _call(orch.list_agents())


@router.post(
    "/agents",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": AgentRequest.model_json_schema()}}
        }
    },
)
async def register_agent(request: Request, orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Register (or replace) an agent `{id, system_prompt, tools, model}`."""
    try:
        body = await _parse(request, AgentRequest)
    except OrchestrationError as exc:
        return _error(exc)
    return await _call(
        orch.register_agent(
            id=body.id,
            system_prompt=body.system_prompt,
            tools=body.tools,
            model=body.model,
            description=body.description,
        ),
        201,
    )


@router.get("/agents/{agent_id}")
async def get_agent(agent_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    return await _call(orch.get_agent(agent_id))


@router.delete("/agents/{agent_id}")
async def delete_agent(agent_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    async def remove() -> dict[str, Any]:
        await orch.remove_agent(agent_id)
        return {"id": agent_id, "deleted": True}

    return await _call(remove())


# -- tasks --------------------------------------------------------------------------------


@router.post(
    "/tasks",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": TaskRequest.model_json_schema()}}
        }
    },
)
async def create_task(request: Request, orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Create a task `{goal, tools, max_steps, agent?, model?}`; it runs in the background."""
    try:
        body = await _parse(request, TaskRequest)
    except OrchestrationError as exc:
        return _error(exc)
    return await _call(
        orch.create_task(
            goal=body.goal,
            tools=body.tools,
            max_steps=body.max_steps,
            agent=body.agent,
            model=body.model,
        ),
        201,
    )


@router.get("/tasks")
async def list_tasks(
    status: str | None = Query(default=None),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0),
    orch: Orchestrator = Depends(orchestrator),
) -> Response:
    """Tasks, newest first (bare array); `?status=` filters."""
    return await _call(orch.list_tasks(status, limit, offset))


@router.get("/tasks/{task_id}")
async def get_task(task_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    return await _call(orch.get_task(task_id))


@router.post("/tasks/{task_id}/cancel")
async def cancel_task(task_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Cancel a pending or running task; `409` once it has finished."""
    return await _call(orch.cancel_task(task_id))


@router.get("/tasks/{task_id}/events", response_class=Response, responses=_SSE_DOC)
async def task_events(
    task_id: str,
    request: Request,
    last_event_id: int | None = Query(default=None),
    orch: Orchestrator = Depends(orchestrator),
) -> Response:
    """The task's events; join at any time, resume with `Last-Event-ID`."""
    try:
        after = _last_event_id(request, last_event_id)
        await orch.get_task(task_id)
    except OrchestrationError as exc:
        return _error(exc)
    return _stream(orch, f"task:{task_id}", after)


# -- workflows ----------------------------------------------------------------------------


@router.post(
    "/workflows",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": WorkflowRequest.model_json_schema()}}
        }
    },
)
async def create_workflow(request: Request, orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Create and start a workflow (a DAG of `run` and `task` steps)."""
    raw = await request.body()
    try:
        try:
            data = json.loads(raw or b"null")
        except ValueError as exc:
            raise Invalid(f"body: not JSON ({exc})", where="body") from None
        req = parse_workflow(data)
    except OrchestrationError as exc:
        return _error(exc)
    return await _call(orch.create_workflow(req), 201)


@router.get("/workflows")
async def list_workflows(
    status: str | None = Query(default=None),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0),
    orch: Orchestrator = Depends(orchestrator),
) -> Response:
    return await _call(orch.list_workflows(status, limit, offset))


@router.get("/workflows/{workflow_id}")
async def get_workflow(workflow_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    return await _call(orch.get_workflow(workflow_id))


@router.post("/workflows/{workflow_id}/cancel")
async def cancel_workflow(workflow_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    """Stop running steps, skip pending ones; `409` on a finished workflow."""
    return await _call(orch.cancel_workflow(workflow_id))


@router.get("/workflows/{workflow_id}/events", response_class=Response, responses=_SSE_DOC)
async def workflow_events(
    workflow_id: str,
    request: Request,
    last_event_id: int | None = Query(default=None),
    orch: Orchestrator = Depends(orchestrator),
) -> Response:
    try:
        after = _last_event_id(request, last_event_id)
        await orch.get_workflow(workflow_id)
    except OrchestrationError as exc:
        return _error(exc)
    return _stream(orch, f"workflow:{workflow_id}", after)


# -- metrics ------------------------------------------------------------------------------


@router.get("/metrics")
async def metrics(orch: Orchestrator = Depends(orchestrator)) -> Response:
    """`{total_agents, active_tasks, completed_tasks, avg_task_duration_ms, failed_tasks,
    cancelled_tasks, total_workflows, running_workflows}`."""
    return await _call(orch.metrics())


class OrchestrationCollector(Collector):
    """The metrics route's figures in Prometheus /metrics (read when scraped)."""

    GAUGES = ("total_agents", "active_tasks", "running_workflows", "avg_task_duration_ms")

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        figures = self.orch.store.metrics()
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


def install(app: FastAPI, settings: Settings, pool: SandboxPool) -> Orchestrator:
    """Build the orchestrator (started and closed by the app's lifespan) and add the routes."""
    orch = Orchestrator(settings, make_executor(settings, pool))
    app.state.orchestrator = orch
    app.include_router(router)
    metrics = getattr(app.state, "metrics", None)
    registry = getattr(metrics, "registry", None)
    if registry is not None:
        registry.register(OrchestrationCollector(orch))
    return orch
