"""``POST /api/v1/execute | eval | call/{builtin} | pipeline``: run code, answer the envelope.

The job builders here are the only place a request body becomes a sandbox :class:`Job`; the
streaming routes and the fast path (``fast_path.py``) use them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from conch.lang.builtins.registry import lookup
from conch.sandbox.envelope import PipelineEnvelope, RunEnvelope
from conch.sandbox.jobs import Job
from conch.web.agent.deps import RunsDep
from conch.web.agent.errors import unknown_builtin
from conch.web.agent.protocol import (
    ERRORS,
    UNKNOWN_BUILTIN,
    CallRequest,
    EvalRequest,
    ExecuteRequest,
    PipelineRequest,
    RunLimits,
    parse_body,
    request_body,
)
from conch.web.common.auth import principal_of

router = APIRouter(tags=["execution"])


def _limits(limits: RunLimits | None) -> dict[str, Any] | None:
    return limits.requested() if limits is not None else None


def execute_job(body: ExecuteRequest) -> Job:
    return Job("program", source=body.command, limits=_limits(body.limits))


def eval_job(body: EvalRequest) -> Job:
    return Job("program", source=body.code, limits=_limits(body.limits))


def pipeline_job(body: PipelineRequest) -> Job:
    return Job("pipeline", input=body.input, steps=body.steps, limits=_limits(body.limits))


def call_job(builtin: str, body: CallRequest) -> Job:
    return Job(
        "call", builtin=builtin, args=body.args, kwargs=body.kwargs, limits=_limits(body.limits)
    )


# Path -> (body model, job builder, metrics kind) of the routes the fast path serves. A body
# with a ``session`` runs in that session's worker (Runs).
FAST_ROUTES: dict[str, tuple[type[BaseModel], Callable[[Any], Job], str]] = {
    "/api/v1/execute": (ExecuteRequest, execute_job, "execute"),
    "/api/v1/eval": (EvalRequest, eval_job, "eval"),
    "/api/v1/pipeline": (PipelineRequest, pipeline_job, "pipeline"),
}


def _route(
    path: str,
    body: type[BaseModel],
    envelope: type[RunEnvelope] = RunEnvelope,
    responses: dict[int | str, dict[str, Any]] = ERRORS,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return router.post(
        path, openapi_extra=request_body(body), response_model=envelope, responses=responses
    )


@_route("/api/v1/execute", ExecuteRequest)
async def execute(request: Request, runs: RunsDep) -> Response:
    """Run a conch command; the envelope holds its value, output and any error."""
    body = await parse_body(request, ExecuteRequest)
    return await runs.respond(execute_job(body), "execute", principal_of(request), body.session)


@_route("/api/v1/eval", EvalRequest)
async def evaluate(request: Request, runs: RunsDep) -> Response:
    """Evaluate a conch program (an expression or statements)."""
    body = await parse_body(request, EvalRequest)
    return await runs.respond(eval_job(body), "eval", principal_of(request), body.session)


@_route("/api/v1/call/{builtin}", CallRequest, responses={**ERRORS, **UNKNOWN_BUILTIN})
async def call(builtin: str, request: Request, runs: RunsDep) -> Response:
    """Call one builtin with positional `args` and named `kwargs`."""
    body = await parse_body(request, CallRequest)
    if lookup(builtin) is None:
        raise unknown_builtin(builtin)
    return await runs.respond(call_job(builtin, body), "call", principal_of(request), body.session)


@_route("/api/v1/pipeline", PipelineRequest, PipelineEnvelope)
async def pipeline(request: Request, runs: RunsDep) -> Response:
    """Feed `input` through each stage of `steps`; adds per-step timings."""
    body = await parse_body(request, PipelineRequest)
    return await runs.respond(pipeline_job(body), "pipeline", principal_of(request), body.session)
