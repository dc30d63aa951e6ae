"""``POST /api/v1/stream/execute | eval | pipeline``: the execution routes as Server-Sent Events.

Events (``id`` counts 1, 2, 3, … per stream): ``start {id}``, ``progress {step, total,
message}``, ``data {result}`` per printed line or produced element, then ``complete
{result, elapsed_ms, type}`` or ``error {message, kind, line, column, hint}``. A client that
goes away cancels the run (its worker is killed and replaced).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from conch.errors import Unavailable
from conch.keys import Admission, Principal
from conch.sandbox.envelope import RunEnvelope, RunError
from conch.sandbox.jobs import Event, Job
from conch.web.agent.deps import RunsDep
from conch.web.agent.execution import eval_job, execute_job, pipeline_job
from conch.web.agent.protocol import (
    ERRORS,
    EvalRequest,
    ExecuteRequest,
    PipelineRequest,
    parse_body,
    request_body,
)
from conch.web.agent.runs import Runs
from conch.web.common.auth import principal_of
from conch.web.common.sse import EventStreamResponse, encode_event

router = APIRouter(tags=["streaming"])

_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: start, progress, data, complete | error",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **ERRORS,
}


def _error_message(error: RunError) -> str:
    message = error.message
    if error.line is not None and f"line {error.line}" not in message:
        message += f" at line {error.line}, column {error.column}"
    return message


async def admitted(runs: Runs, job: Job, request: Request) -> tuple[Principal, Admission]:
    """Admit a streamed run against the caller's key before its ``200`` (a refusal is a
    ``429``, not an error event)."""
    job.stream = True
    principal = principal_of(request)
    return principal, await runs.admit(principal, job)


async def stream(
    runs: Runs,
    job: Job,
    kind: str,
    principal: Principal | None = None,
    admission: Admission | None = None,
    session: str | None = None,
) -> EventStreamResponse:
    """The run's events as SSE; ``admission`` (:func:`admitted`) is settled when it ends. In
    a ``session``, the session is taken (found, its lease, a worker) before the answer
    starts, so that a session not found or busy elsewhere is an HTTP error; ``complete`` and
    ``error`` then add ``unsaved``."""
    job.stream = True
    run_id = runs.pool.new_run_id()
    began = time.perf_counter()
    source: AsyncGenerator[Event, None]
    first: Event | None = None
    if session is not None:
        try:
            if runs.sessions is None:
                raise Unavailable("this server runs no sessions", where="session")
            tenant = principal.reads if principal is not None else None
            source = runs.sessions.events(session, job, tenant=tenant)
            try:
                first = await anext(source)
            except BaseException:
                await source.aclose()
                raise
        except BaseException:
            if admission is not None:
                await runs.release(principal, admission)
            raise
    else:
        source = runs.pool.events(job)

    async def chained() -> AsyncGenerator[Event, None]:
        if first is not None:
            yield first
        async for e in source:
            yield e

    finished: list[RunEnvelope] = []

    async def events() -> AsyncGenerator[bytes, None]:
        try:
            async with aclosing(run_events()) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if admission is not None and admission.recorded:
                await runs.finish(principal, admission, finished[0] if finished else None)

    async def run_events() -> AsyncGenerator[bytes, None]:
        started = began if session is not None else time.perf_counter()
        seq = 0

        def event(name: str, data: dict[str, Any]) -> bytes:
            nonlocal seq
            seq += 1
            return encode_event(data, event=name, id=seq)

        yield event("start", {"id": run_id})
        async with aclosing(source), aclosing(chained()) as run_events:
            async for e in run_events:
                if e.kind == "data":
                    yield event("data", {"result": e.text})
                elif e.kind == "progress":
                    yield event(
                        "progress", {"step": e.step, "total": e.total, "message": e.message}
                    )
                elif e.kind == "done" and e.result is not None:
                    finished.append(e.result)
                    runs.metrics.observe_run(kind, started)
                    elapsed = int((time.perf_counter() - started) * 1000)
                    done = e.result
                    extra = {} if session is None else {"unsaved": e.unsaved or []}
                    if done.error is None:
                        complete = {"result": done.result, "elapsed_ms": elapsed, "type": done.type}
                        yield event("complete", {**complete, **extra})
                    else:
                        failure = {**done.error.to_json(), "message": _error_message(done.error)}
                        yield event("error", {**failure, **extra})

    return EventStreamResponse(events())


def _route(path: str, model: type[Any]) -> Any:
    return router.post(
        path,
        openapi_extra=request_body(model),
        response_model=None,
        response_class=Response,
        responses=_SSE_DOC,
    )


@_route("/api/v1/stream/execute", ExecuteRequest)
async def stream_execute(request: Request, runs: RunsDep) -> EventStreamResponse:
    """As execute, as Server-Sent Events."""
    body = await parse_body(request, ExecuteRequest)
    job = execute_job(body)
    return await stream(runs, job, "stream_execute", *await admitted(runs, job, request), body.session)


@_route("/api/v1/stream/eval", EvalRequest)
async def stream_eval(request: Request, runs: RunsDep) -> EventStreamResponse:
    """As eval, as Server-Sent Events."""
    body = await parse_body(request, EvalRequest)
    job = eval_job(body)
    return await stream(runs, job, "stream_eval", *await admitted(runs, job, request), body.session)


@_route("/api/v1/stream/pipeline", PipelineRequest)
async def stream_pipeline(request: Request, runs: RunsDep) -> EventStreamResponse:
    """As pipeline, step by step, as Server-Sent Events."""
    body = await parse_body(request, PipelineRequest)
    job = pipeline_job(body)
    return await stream(runs, job, "stream_pipeline", *await admitted(runs, job, request), body.session)
