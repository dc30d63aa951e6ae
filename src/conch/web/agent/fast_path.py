"""The hot execution routes (``POST`` execute, eval, pipeline), served before the framework.

Running ``1 + 1`` costs one round trip to a sandbox process, and FastAPI's per-request layers
(error pages, telemetry, routing, dependency resolution) would cost as much again. So
:class:`AgentApp` hands these paths to :class:`FastPath`, which uses the same body models
and job builders (``execution.FAST_ROUTES``), the same :class:`~conch.web.agent.runs.Runs`,
the same error envelope and the same middleware as the documented routes — it skips only
the framework's own layers, never the security checks (the guard's authentication in the
middleware, and the route's own guard: its scope and the key's limits). The FastAPI routes
remain the reference for these paths (OpenAPI, other methods).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from conch.errors import DomainError
from conch.sandbox.jobs import Job
from conch.web.agent.errors import agent_error_bytes, problems
from conch.web.agent.execution import FAST_ROUTES, pipeline_job
from conch.web.agent.protocol import PipelineRequest
from conch.web.agent.runs import Runs
from conch.web.common.auth import guard_of
from conch.web.common.errors import agent_error_body


class AgentApp(FastAPI):
    fast_paths: frozenset[str] = frozenset()
    fast_app: ASGIApp | None = None

    def serve_fast(
        self, runs: Runs, middleware: Sequence[Middleware], routes: Sequence[BaseRoute]
    ) -> None:
        """Serve ``FAST_ROUTES`` through ``middleware`` (outermost first) and a FastPath;
        ``routes`` are the documented routes of those paths (for the metrics' label and their
        guards: call once the routes are guarded)."""
        by_path = {getattr(r, "path", None): r for r in routes}
        inner: ASGIApp = FastPath(runs, {path: by_path[path] for path in FAST_ROUTES})
        for m in reversed(middleware):
            inner = m.cls(inner, *m.args, **m.kwargs)
        self.fast_app = inner
        self.fast_paths = frozenset(FAST_ROUTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] in self.fast_paths
            and scope["method"] == "POST"
            and self.fast_app is not None
        ):
            await self.fast_app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class FastPath:
    """The ASGI endpoint of the hot routes: body model, job, envelope and errors as the
    documented routes, without the framework's per-request machinery."""

    def __init__(self, runs: Runs, routes: dict[str, Any]) -> None:
        self.runs = runs
        # The documented route of each path, for the metrics' route label, and its guard.
        self.routes = routes
        self.guards = {path: guard_of(route) for path, route in routes.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        model, make_job, kind = FAST_ROUTES[path]
        scope["route"] = self.routes[path]
        try:
            principal = await self.guards[path].check(scope)
        except DomainError as exc:
            await _send_error(send, exc)
            return
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body: bytes = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
        try:
            if kind == "pipeline":
                job, session = _pipeline_job(body)
            else:
                request = model.model_validate_json(body)
                job, session = make_job(request), request.session  # type: ignore[attr-defined]
        except ValidationError as exc:
            await _send(send, 400, agent_error_body(400, problems(exc.errors(include_url=False))))
            return
        try:
            answer = await self.runs.envelope(job, kind, principal, session)
        except DomainError as exc:  # a limit of the key, or a session's refusal (not found, busy)
            await _send_error(send, exc)
            return
        except Exception:
            # What the framework's error middleware does for the other routes: a 500, and
            # the exception goes on to the server's log.
            await _send(send, 500, agent_error_body(500, "internal server error"))
            raise
        await _send(send, 200, answer)


class _PipelineParts(msgspec.Struct):
    """A pipeline body with its ``input`` left as the client's JSON text: the server never
    needs the values, and building 10,000 Python objects only to send them on as JSON
    cost more than the rest of the request's server-side work."""

    input: msgspec.Raw = msgspec.Raw(b"null")
    steps: Any = msgspec.UNSET
    limits: Any = None
    session: Any = None


_PIPELINE_PARTS = msgspec.json.Decoder(_PipelineParts)


def _pipeline_job(body: bytes) -> tuple[Job, str | None]:
    """The job of a pipeline body, validated by the same model as the documented route, and
    its session. A body msgspec does not read (not JSON, or NaN, which pydantic accepts) or
    that the model refuses goes to the model whole, for exactly the documented route's value
    or error."""
    try:
        parts = _PIPELINE_PARTS.decode(body)
        fields: dict[str, Any] = {"limits": parts.limits, "session": parts.session}
        if parts.steps is not msgspec.UNSET:
            fields["steps"] = parts.steps
        request = PipelineRequest.model_validate(fields)
    except (msgspec.DecodeError, ValidationError, RecursionError):
        # RecursionError: msgspec skips ``input`` recursively and gives up on JSON nested
        # deeper than Python's own limit; the model's parser has a limit of its own and
        # refuses such a body with the documented route's 400.
        request = PipelineRequest.model_validate_json(body)
        return pipeline_job(request), request.session
    job = pipeline_job(request)
    job.input_json = bytes(parts.input)
    return job, request.session


_JSON = (b"content-type", b"application/json")


async def _send(
    send: Send, status: int, body: bytes, extra: dict[str, str] | None = None
) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, exc: DomainError) -> None:
    """A refusal in the agent envelope, as the app's handler writes it."""
    await _send(send, exc.status, agent_error_bytes(exc), exc.headers)
