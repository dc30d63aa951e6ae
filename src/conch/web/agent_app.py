"""The agent and code-execution server (``conch serve``): execution, streams, discovery, health.

Routes are thin: they validate the body, hand a :class:`~conch.agents.sandbox.Job` to the
sandbox pool (programs never run in this process) and shape the answer. Contract: the seed
document's execution, streaming, discovery and health sections and SPEC §2.1, §2.2, §2.4, §2.6.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from conch import __version__
from conch.agents.sandbox import Job, SandboxPool
from conch.config import Settings
from conch.lang import schema
from conch.lang.builtins.registry import REGISTRY, load_all, lookup
from conch.lang.errors import did_you_mean
from conch.web.agent_metrics import CONTENT_TYPE, AgentMetrics, MetricsMiddleware
from conch.web.agent_protocol import (
    BuiltinDetail,
    BuiltinSummary,
    CallRequest,
    Envelope,
    EvalRequest,
    ExecuteRequest,
    Health,
    PipelineEnvelope,
    PipelineRequest,
    RequestErrorBody,
    RunLimits,
    TypeInfo,
)
from conch.web.security import SecurityMiddleware, error_body, is_loopback
from conch.web.sse import EventStreamResponse, format_event
from conch.web.studio import ALL_PAGES, mount_studio


class ConfigurationError(Exception):
    """The server must not start with these settings."""


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": RequestErrorBody, "description": "Malformed request"},
    413: {"model": RequestErrorBody, "description": "Body too large"},
}

_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: start, progress, data, complete | error",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **_ERRORS,
}


_REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ExecuteRequest,
    EvalRequest,
    CallRequest,
    PipelineRequest,
)


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its body itself."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    """The body as ``model``, parsed as JSON whatever the Content-Type says (``curl -d``
    sends a form type); any problem is a ``400 RequestError`` naming the field."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json")


def _error(status: int, message: str, kind: str = "RequestError", **extra: Any) -> Response:
    return Response(
        error_body(status, message, kind, **extra), status, media_type="application/json"
    )


def _limits(limits: RunLimits | None) -> dict[str, Any] | None:
    return limits.requested() if limits is not None else None


def _envelope(done: dict[str, Any], elapsed_ms: int, pipeline: bool) -> dict[str, Any]:
    out = {
        "success": done["success"],
        "result": done.get("result"),
        "type": done.get("type"),
        "value": done.get("value"),
        "output": done.get("output", []),
        "error": done.get("error"),
        "elapsed_ms": elapsed_ms,
    }
    if pipeline:
        out["steps"] = done.get("steps", [])
    return out


def _error_message(error: dict[str, Any]) -> str:
    message = str(error.get("message", ""))
    line = error.get("line")
    if line is not None and f"line {line}" not in message:
        message += f" at line {line}, column {error.get('column')}"
    return message


def check_settings(settings: Settings) -> None:
    if not is_loopback(settings.host) and not settings.api_key:
        raise ConfigurationError(
            f"refusing to bind {settings.host}: a non-loopback address needs an API key "
            "(set api_key in conch.toml or CONCH_API_KEY)"
        )


def create_app(settings: Settings, pool: SandboxPool | None = None) -> FastAPI:
    """The agent server app. Raises :class:`ConfigurationError` for an unsafe configuration."""
    check_settings(settings)
    load_all()
    pool = pool or SandboxPool(settings)
    started_at = time.monotonic()
    metrics = AgentMetrics(pool)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.close()

    app = AgentApp(
        title="conch agent server",
        version=__version__,
        description="Runs conch code over HTTP, streams results, publishes the language schema.",
        openapi_url="/api-docs/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.pool = pool
    app.state.metrics = metrics

    # -- errors ---------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _error(400, _problems(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        headers = dict(exc.headers or {})
        response = _error(status, str(exc.detail))
        response.headers.update(headers)
        return response

    # -- execution ------------------------------------------------------------------------

    async def run_body(job: Job, kind: str) -> bytes:
        started = time.perf_counter()
        done = await pool.run(job)
        metrics.observe_run(kind, started)
        elapsed = int((time.perf_counter() - started) * 1000)
        envelope = _envelope(done, elapsed, job.mode == "pipeline")
        return json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()

    async def run(job: Job, kind: str) -> Response:
        return Response(await run_body(job, kind), media_type="application/json")

    def stream(job: Job, kind: str) -> EventStreamResponse:
        job.stream = True
        run_id = pool.new_run_id()

        async def events() -> AsyncGenerator[bytes, None]:
            started = time.perf_counter()
            seq = 0

            def event(name: str, data: dict[str, Any]) -> bytes:
                nonlocal seq
                seq += 1
                return format_event(name, seq, data)

            yield event("start", {"id": run_id})
            async with aclosing(pool.events(job)) as run_events:
                async for e in run_events:
                    if e.kind == "data":
                        yield event("data", {"result": e.text})
                    elif e.kind == "progress":
                        yield event(
                            "progress", {"step": e.step, "total": e.total, "message": e.message}
                        )
                    elif e.kind == "done" and e.result is not None:
                        metrics.observe_run(kind, started)
                        elapsed = int((time.perf_counter() - started) * 1000)
                        done = e.result
                        if done["success"]:
                            yield event(
                                "complete",
                                {
                                    "result": done["result"],
                                    "elapsed_ms": elapsed,
                                    "type": done["type"],
                                },
                            )
                        else:
                            err = done["error"]
                            yield event(
                                "error",
                                {
                                    "message": _error_message(err),
                                    "kind": err["kind"],
                                    "line": err.get("line"),
                                    "column": err.get("column"),
                                    "hint": err.get("hint"),
                                },
                            )

        return EventStreamResponse(events())

    @app.post(
        "/api/v1/execute",
        openapi_extra=_body(ExecuteRequest),
        response_model=Envelope,
        responses=_ERRORS,
        tags=["execution"],
    )
    async def execute(request: Request) -> Response:
        """Run a conch command; the envelope holds its value, output and any error."""
        body = await parse_body(request, ExecuteRequest)
        return await run(
            Job("program", source=body.command, limits=_limits(body.limits)), "execute"
        )

    @app.post(
        "/api/v1/eval",
        openapi_extra=_body(EvalRequest),
        response_model=Envelope,
        responses=_ERRORS,
        tags=["execution"],
    )
    async def evaluate(request: Request) -> Response:
        """Evaluate a conch program (an expression or statements)."""
        body = await parse_body(request, EvalRequest)
        return await run(Job("program", source=body.code, limits=_limits(body.limits)), "eval")

    @app.post(
        "/api/v1/call/{builtin}",
        openapi_extra=_body(CallRequest),
        response_model=Envelope,
        responses={**_ERRORS, 404: {"model": RequestErrorBody, "description": "No such builtin"}},
        tags=["execution"],
    )
    async def call(builtin: str, request: Request) -> Response:
        """Call one builtin with positional `args` and named `kwargs`."""
        body = await parse_body(request, CallRequest)
        if lookup(builtin) is None:
            return _unknown_builtin(builtin)
        job = Job(
            "call", builtin=builtin, args=body.args, kwargs=body.kwargs, limits=_limits(body.limits)
        )
        return await run(job, "call")

    @app.post(
        "/api/v1/pipeline",
        openapi_extra=_body(PipelineRequest),
        response_model=PipelineEnvelope,
        responses=_ERRORS,
        tags=["execution"],
    )
    async def pipeline(request: Request) -> Response:
        """Feed `input` through each stage of `steps`; adds per-step timings."""
        body = await parse_body(request, PipelineRequest)
        job = Job("pipeline", input=body.input, steps=body.steps, limits=_limits(body.limits))
        return await run(job, "pipeline")

    @app.post(
        "/api/v1/stream/execute",
        openapi_extra=_body(ExecuteRequest),
        response_model=None,
        response_class=Response,
        responses=_SSE_DOC,
        tags=["streaming"],
    )
    async def stream_execute(request: Request) -> EventStreamResponse:
        """As execute, as Server-Sent Events."""
        body = await parse_body(request, ExecuteRequest)
        return stream(
            Job("program", source=body.command, limits=_limits(body.limits)), "stream_execute"
        )

    @app.post(
        "/api/v1/stream/eval",
        openapi_extra=_body(EvalRequest),
        response_model=None,
        response_class=Response,
        responses=_SSE_DOC,
        tags=["streaming"],
    )
    async def stream_eval(request: Request) -> EventStreamResponse:
        """As eval, as Server-Sent Events."""
        body = await parse_body(request, EvalRequest)
        return stream(Job("program", source=body.code, limits=_limits(body.limits)), "stream_eval")

    @app.post(
        "/api/v1/stream/pipeline",
        openapi_extra=_body(PipelineRequest),
        response_model=None,
        response_class=Response,
        responses=_SSE_DOC,
        tags=["streaming"],
    )
    async def stream_pipeline(request: Request) -> EventStreamResponse:
        """As pipeline, step by step, as Server-Sent Events."""
        body = await parse_body(request, PipelineRequest)
        job = Job("pipeline", input=body.input, steps=body.steps, limits=_limits(body.limits))
        return stream(job, "stream_pipeline")

    # -- discovery ------------------------------------------------------------------------

    cache: dict[str, bytes] = {}

    def cached(key: str, build: Any) -> Response:
        body = cache.get(key)
        if body is None:
            body = json.dumps(build(), ensure_ascii=False, separators=(",", ":")).encode()
            cache[key] = body
        return Response(body, media_type="application/json")

    def _unknown_builtin(name: str) -> Response:
        hint = did_you_mean(name, REGISTRY)
        return _error(404, f"unknown builtin {name!r}", kind="NameError", hint=hint)

    @app.get("/api/v1/builtins", response_model=list[BuiltinSummary], tags=["discovery"])
    async def list_builtins(category: str | None = Query(default=None)) -> Response:
        """Every builtin as `{name, description, category}`; `?category=` filters."""
        return cached(f"builtins:{category}", lambda: schema.builtins(category))

    @app.get(
        "/api/v1/builtins/{name}",
        response_model=BuiltinDetail,
        responses={404: {"model": RequestErrorBody, "description": "No such builtin"}},
        tags=["discovery"],
    )
    async def get_builtin(name: str) -> Response:
        """One builtin with signature, parameters, examples, effect and aliases."""
        b = lookup(name)
        if b is None:
            return _unknown_builtin(name)
        return cached(f"builtin:{name}", b.to_dict)

    @app.get("/api/v1/types", response_model=list[TypeInfo], tags=["discovery"])
    async def list_types() -> Response:
        """Value types and record shapes with their JSON Schema and properties."""
        return cached("types", schema.types)

    @app.get("/api/v1/schema", tags=["discovery"])
    async def get_schema() -> Response:
        """The complete language schema: types, builtins and syntax."""
        return cached("schema", schema.language_schema)

    @app.get(
        "/api/v1/schema/{format}",
        responses={404: {"model": RequestErrorBody, "description": "Unknown format"}},
        tags=["discovery"],
    )
    async def get_schema_format(format: str, request: Request) -> Response:
        """The schema as `json` (JSON Schema), `openapi` (3.1), `openai`, `anthropic` or `mcp`."""
        if format not in schema.FORMATS:
            valid = ", ".join(schema.FORMATS)
            return _error(
                404,
                f"unknown schema format {format!r}; valid formats: {valid}",
                valid=list(schema.FORMATS),
            )
        if format == "openapi":
            base = str(request.base_url).rstrip("/")
            return cached(f"schema:openapi:{base}", lambda: schema.openapi(base))
        return cached(f"schema:{format}", lambda: schema.export(format))

    # -- health and metrics ---------------------------------------------------------------

    @app.get("/health", response_model=Health, tags=["health"])
    async def health() -> Response:
        """Liveness: `{status: "healthy", version, uptime_seconds}` (no key needed)."""
        uptime = int(time.monotonic() - started_at)
        return _json({"status": "healthy", "version": __version__, "uptime_seconds": uptime})

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
        tags=["health"],
    )
    async def prometheus_metrics() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    _document_request_errors(app)

    def execute_job(body: ExecuteRequest) -> Job:
        return Job("program", source=body.command, limits=_limits(body.limits))

    def eval_job(body: EvalRequest) -> Job:
        return Job("program", source=body.code, limits=_limits(body.limits))

    def pipeline_job(body: PipelineRequest) -> Job:
        return Job("pipeline", input=body.input, steps=body.steps, limits=_limits(body.limits))

    routes = {getattr(r, "path", None): r for r in app.router.routes}
    fast = FastPath(
        handlers={
            "/api/v1/execute": (ExecuteRequest, execute_job, "execute", routes["/api/v1/execute"]),
            "/api/v1/eval": (EvalRequest, eval_job, "eval", routes["/api/v1/eval"]),
            "/api/v1/pipeline": (
                PipelineRequest,
                pipeline_job,
                "pipeline",
                routes["/api/v1/pipeline"],
            ),
        },
        run_body=run_body,
    )

    def guarded(inner: ASGIApp) -> ASGIApp:
        guard = SecurityMiddleware(
            inner,
            api_key=settings.api_key,
            loopback_only=is_loopback(settings.host),
            max_body_bytes=settings.max_body_bytes,
        )
        return MetricsMiddleware(guard, metrics=metrics)

    # Both stacks share the same guard and metrics policy: the hot routes only skip the
    # framework's own layers, never the security checks.
    app.add_middleware(
        SecurityMiddleware,
        api_key=settings.api_key,
        loopback_only=is_loopback(settings.host),
        max_body_bytes=settings.max_body_bytes,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.fast_paths = frozenset(fast.handlers)
    app.fast_app = guarded(fast)
    mount_studio(app, ALL_PAGES)
    return app


class AgentApp(FastAPI):
    """The FastAPI app, with its hot execution routes (``POST`` execute, eval, pipeline)
    dispatched before the framework's middleware stack (error pages, telemetry, routing,
    dependency resolution): running ``1 + 1`` costs one round trip to a sandbox process, and
    those layers would otherwise cost as much again. The documented FastAPI routes remain
    the reference for these paths and serve every other method."""

    fast_paths: frozenset[str] = frozenset()
    fast_app: ASGIApp | None = None

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


def _problems(errors: Sequence[Any]) -> str:
    problems = []
    for err in list(errors)[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


class FastPath:
    """The ASGI endpoint of the hot execution routes: the same body model, job, envelope
    and errors as the documented FastAPI routes, without the framework's per-request
    machinery."""

    def __init__(
        self,
        *,
        handlers: dict[str, tuple[type[BaseModel], Callable[[Any], Job], str, Any]],
        run_body: Callable[[Job, str], Awaitable[bytes]],
    ) -> None:
        self.handlers = handlers
        self.run_body = run_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model, make_job, kind, route = self.handlers[scope["path"]]
        scope["route"] = route  # for the metrics' route label
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
            parsed = model.model_validate_json(body)
        except ValidationError as exc:
            await _send(send, 400, error_body(400, _problems(exc.errors(include_url=False))))
            return
        try:
            answer = await self.run_body(make_job(parsed), kind)
        except Exception:
            # What the framework's error middleware does for the other routes: a 500, and
            # the exception goes on to the server's log.
            await _send(send, 500, error_body(500, "internal server error", "InternalError"))
            raise
        await _send(send, 200, answer)


_JSON = (b"content-type", b"application/json")


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _document_request_errors(app: FastAPI) -> None:
    """Replace FastAPI's documented ``422`` (never sent) with the ``400`` that is."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = original()
        for operations in doc.get("paths", {}).values():
            for op in operations.values():
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": "Malformed request",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/RequestErrorBody"}
                            }
                        },
                    }
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in _REQUEST_MODELS:
            body_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(body_schema.pop("$defs", {}))
            schemas[model.__name__] = body_schema
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
