"""The inference server: an OpenAI-compatible HTTP API over conch's model store and engines.

Routes are thin: validate (``openai_protocol``), call the domain (``conch.inference``),
shape the answer. Generation never runs on the event loop; the llama.cpp worker threads
push tokens to it, so health checks stay fast while streams generate.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse

import conch
from conch.config import Settings
from conch.inference.acquire import default_embedding_record
from conch.inference.bundled import ensure_bundled_model
from conch.inference.chat import (
    ChatEvent,
    ChatInputError,
    ChatSpec,
    ToolSpec,
    build_prompt,
    plan_constraints,
    start_chat,
)
from conch.inference.engine import ContextLengthExceeded, EngineError, QueueFull, SamplingParams
from conch.inference.llama_engine import LlamaEngine
from conch.inference.manager import ModelManager, ModelNotFound, ModelNotReady
from conch.inference.onnx_engine import OnnxRuntimeMissing
from conch.inference.store import ModelRecord, ModelStore
from conch.web import openai_protocol as p
from conch.web.errors import APIError, install_error_handlers
from conch.web.studio import INFERENCE_PAGES, mount_studio

# Provider kinds a later issue adds; a model string with one of these prefixes is remote.
REMOTE_PROVIDER_KINDS = ("ollama", "openai", "anthropic", "vllm", "llamacpp", "lmstudio")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": p.ErrorResponse, "description": desc}
    for code, desc in (
        (400, "Invalid request"),
        (404, "Unknown model"),
        (429, "Queue full"),
        (500, "Server error"),
    )
}


@dataclass
class Metrics:
    requests: dict[tuple[str, str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    gen_seconds: float = 0.0
    gen_tokens: int = 0
    last_tokens_per_second: float = 0.0
    embedded_inputs: int = 0

    def observe_generation(self, ttft: float | None, seconds: float, tokens: int) -> None:
        if ttft is not None:
            self.ttft_sum += ttft
            self.ttft_count += 1
        if tokens > 0 and seconds > 0:
            self.gen_seconds += seconds
            self.gen_tokens += tokens
            self.last_tokens_per_second = tokens / seconds


class _CountRequests:
    """ASGI middleware: counts every completed API request (streams count when they end)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def wrapped(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send=wrapped)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            key = (scope.get("method", ""), path, status)
            m: Metrics = self.state.metrics
            m.requests[key] = m.requests.get(key, 0) + 1
            if path.startswith("/v1/"):
                self.state.requests_served += 1


def create_app(settings: Settings) -> FastAPI:
    store = ModelStore(settings)
    manager = ModelManager(settings, store)
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.ensure_dirs()
        await asyncio.to_thread(ensure_bundled_model, store)
        yield
        await manager.unload_all()

    app = FastAPI(
        title="conch inference server",
        version=conch.__version__,
        description="OpenAI-compatible chat completions and embeddings on local GGUF models (llama.cpp) "
        "and ONNX embedding models (onnxruntime), "
        "with a model registry, storage management and providers.",
        openapi_url="/api-docs/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.manager = manager
    app.state.metrics = Metrics()
    app.state.requests_served = 0
    install_error_handlers(app)
    app.add_middleware(_CountRequests, state=app.state)

    # -- helpers -----------------------------------------------------------------------------
    def local_record(model: str, capability: str) -> ModelRecord:
        if ":" in model and not model.startswith("local:"):
            provider = model.split(":", 1)[0]
            if provider in REMOTE_PROVIDER_KINDS or provider in settings.providers:
                raise APIError(
                    501,
                    f"Remote provider '{provider}' is not available in this version of conch; "
                    "only local models can be used",
                    code="provider_not_implemented",
                    param="model",
                )
        try:
            record = manager.record_for(model)
        except ModelNotFound:
            raise APIError(404, f"The model '{model}' does not exist", code="model_not_found", param="model")
        except ModelNotReady as exc:
            raise APIError(409, str(exc), code="model_not_ready", param="model")
        if capability not in record.capabilities:
            raise APIError(
                400, f"The model '{model}' does not support {capability}", code="unsupported_model", param="model"
            )
        return record

    def engine_errors(exc: Exception) -> APIError:
        if isinstance(exc, OnnxRuntimeMissing):
            return APIError(501, str(exc), code="runtime_not_installed", param="model")
        if isinstance(exc, ContextLengthExceeded):
            return APIError(400, str(exc), code="context_length_exceeded", param="messages")
        if isinstance(exc, QueueFull):
            return APIError(429, str(exc), code="queue_full", headers={"Retry-After": "1"})
        if isinstance(exc, ChatInputError):
            return APIError(400, str(exc), param=exc.param, code="invalid_request_error")
        if isinstance(exc, ValueError):
            return APIError(400, str(exc), code="invalid_request_error")
        return APIError(500, f"Inference failed: {exc}", code="inference_error")

    def details(record: ModelRecord) -> p.ModelDetails:
        return p.ModelDetails(
            id=record.id,
            created=record.created,
            owned_by=record.owned_by,
            status=record.status,
            format=record.format,
            path=record.path,
            size_bytes=record.size_bytes,
            sha256=record.sha256,
            architecture=record.architecture,
            context_length=record.context_length,
            quantization=record.quantization,
            capabilities=list(record.capabilities),
            source=record.source,
            revision=record.revision,
            files=record.files,
            converted_from=record.converted_from,
            progress=record.progress,
            loaded=record.id in manager.loaded_ids(),
        )

    # -- chat ------------------------------------------------------------------------------
    @app.post(
        "/v1/chat/completions",
        response_model=p.ChatCompletion,
        responses={**ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "A completion, or SSE chunks when stream is true"}},
        tags=["chat"],
    )
    async def chat_completions(req: p.ChatCompletionRequest, request: Request) -> Any:
        t_start = time.perf_counter()
        record = local_record(req.model, "chat")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > 4:
            raise APIError(400, "At most 4 stop sequences are allowed", param="stop", code="invalid_request_error")
        tools = [
            ToolSpec(t.function.name, t.function.description, t.function.parameters or {"type": "object", "properties": {}})
            for t in req.tools or []
        ]
        tool_choice: str | None
        named: str | None = None
        if isinstance(req.tool_choice, p.NamedToolChoice):
            tool_choice, named = "function", req.tool_choice.function.name
        else:
            tool_choice = req.tool_choice or ("auto" if tools else "none")
        if tool_choice != "none" and not tools:
            raise APIError(400, "tool_choice requires tools", param="tool_choice", code="invalid_request_error")
        rf = req.response_format.model_dump(by_alias=True) if req.response_format is not None else None
        spec = ChatSpec(
            messages=[m.model_dump() for m in req.messages],
            sampling=SamplingParams(
                max_tokens=req.max_completion_tokens or req.max_tokens,
                temperature=0.7 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
                stop=stop,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
            ),
            n=req.n,
            tools=tools,
            tool_choice=tool_choice,
            named_tool=named,
            response_format=rf,
        )
        try:
            plan_constraints(spec)
        except ChatInputError as exc:
            raise engine_errors(exc)

        stack = contextlib.AsyncExitStack()
        try:
            engine = await stack.enter_async_context(manager.use(record.id, req.keep_alive))
            if not isinstance(engine, LlamaEngine):
                # Capabilities already say so for converted models; a hand-registered record may not.
                raise APIError(
                    400, f"The model '{req.model}' does not support chat", code="unsupported_model", param="model"
                )
            prompt = build_prompt(engine, spec)
            events = start_chat(engine, spec, prompt)
        except ValueError as exc:
            await stack.aclose()
            if isinstance(exc, ChatInputError):
                raise engine_errors(exc)
            raise APIError(400, str(exc), param="keep_alive", code="invalid_request_error")
        except (EngineError, ChatInputError) as exc:
            await stack.aclose()
            raise engine_errors(exc)
        except BaseException:
            await stack.aclose()
            raise

        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        metrics: Metrics = app.state.metrics
        n_prompt = len(prompt)

        if not req.stream:
            texts = [""] * spec.n
            calls: list[list[dict[str, Any]] | None] = [None] * spec.n
            reasons = ["stop"] * spec.n
            n_out = 0
            first: float | None = None
            try:
                async for ev in events:
                    if first is None:
                        first = time.perf_counter()
                    if ev.kind == "delta":
                        texts[ev.index] += ev.text
                    elif ev.kind == "tool_calls":
                        calls[ev.index] = ev.tool_calls
                    else:
                        reasons[ev.index] = ev.finish_reason or "stop"
                        n_out += ev.completion_tokens
            except EngineError as exc:
                raise engine_errors(exc)
            finally:
                await stack.aclose()
            now = time.perf_counter()
            metrics.prompt_tokens += n_prompt
            metrics.completion_tokens += n_out
            metrics.observe_generation(None if first is None else first - t_start, now - t_start, n_out)
            return p.ChatCompletion(
                id=cid,
                created=created,
                model=req.model,
                choices=[
                    p.Choice(
                        index=i,
                        message=p.AssistantMessage(
                            content=(texts[i] or None) if calls[i] else texts[i],
                            tool_calls=[p.ToolCall.model_validate(c) for c in calls[i] or []] or None,
                        ),
                        finish_reason=reasons[i],  # type: ignore[arg-type]
                    )
                    for i in range(spec.n)
                ],
                usage=p.Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out),
            )

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        head = json.dumps({"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model})[:-1]

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
            # Built by hand, not through pydantic: this runs once per token on the event loop.
            # The shape is ChatCompletionChunk's (see openai_protocol).
            body = json.dumps({"choices": choices, "usage": usage, "system_fingerprint": None}, ensure_ascii=False)
            return f"data: {head}, {body[1:]}\n\n"

        async def sse() -> AsyncIterator[str]:
            n_out = 0
            first: float | None = None
            try:
                for i in range(spec.n):
                    yield chunk([_choice(i, {"role": "assistant", "content": ""})])
                async for ev in events:
                    if first is None:
                        first = time.perf_counter()
                    yield _event_chunk(ev, chunk)
                    if ev.kind == "finish":
                        n_out += ev.completion_tokens
                if include_usage:
                    yield chunk([], {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out})
                yield "data: [DONE]\n\n"
            except EngineError as exc:
                err = engine_errors(exc)
                yield "data: " + json.dumps({"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}) + "\n\n"
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                await stack.aclose()
                now = time.perf_counter()
                metrics.prompt_tokens += n_prompt
                metrics.completion_tokens += n_out
                metrics.observe_generation(None if first is None else first - t_start, now - t_start, n_out)

        return StreamingResponse(
            sse(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # -- embeddings --------------------------------------------------------------------------
    @app.post(
        "/v1/embeddings",
        response_model=p.EmbeddingResponse,
        responses={**ERRORS, 501: {"model": p.ErrorResponse, "description": "The model's runtime is not installed"}},
        tags=["embeddings"],
    )
    async def embeddings(req: p.EmbeddingRequest) -> Any:
        if req.model is not None:
            record = local_record(req.model, "embeddings")
        else:
            default = await asyncio.to_thread(default_embedding_record, store)
            if default is None:
                raise APIError(
                    400,
                    "'model' is required: no default embedding model is installed "
                    "(`conch models setup` installs all-minilm-l6-v2)",
                    param="model",
                    code="missing_required_parameter",
                )
            record = default
        raw = req.input
        if isinstance(raw, str):
            items: list[str | list[int]] = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            items = [list(raw)]  # type: ignore[arg-type]
        else:
            items = list(raw)  # type: ignore[arg-type]
        if not items:
            raise APIError(400, "'input' must not be empty", param="input", code="invalid_request_error")
        try:
            async with manager.use(record.id, req.keep_alive) as engine:
                token_lists: list[list[int]] = []
                n_vocab = engine.n_vocab
                for i, item in enumerate(items):
                    if isinstance(item, str):
                        if not item:
                            raise APIError(400, f"'input[{i}]' must not be an empty string", param="input", code="invalid_request_error")
                        token_lists.append(engine.tokenize(item))
                    else:
                        if not item or any(t < 0 or t >= n_vocab for t in item):
                            raise APIError(400, f"'input[{i}]' must be a non-empty array of token ids below {n_vocab}", param="input", code="invalid_request_error")
                        token_lists.append(list(item))
                if req.dimensions is not None and req.dimensions > engine.n_embd:
                    raise APIError(400, f"'dimensions' must be at most {engine.n_embd} for this model", param="dimensions", code="invalid_request_error")
                vectors = await asyncio.to_thread(engine.embed, token_lists)
        except ValueError as exc:
            raise APIError(400, str(exc), param="keep_alive", code="invalid_request_error")
        except ContextLengthExceeded as exc:
            raise APIError(400, str(exc).replace("prompt", "input"), code="context_length_exceeded", param="input")
        except EngineError as exc:
            raise engine_errors(exc)
        data = []
        for i, vec in enumerate(vectors):
            if req.dimensions is not None:
                vec = vec[: req.dimensions]
                norm = sum(v * v for v in vec) ** 0.5 or 1.0
                vec = [v / norm for v in vec]
            emb: list[float] | str = vec
            if req.encoding_format == "base64":
                emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
            data.append(p.Embedding(index=i, embedding=emb))
        n_tokens = sum(len(t) for t in token_lists)
        m: Metrics = app.state.metrics
        m.prompt_tokens += n_tokens
        m.embedded_inputs += len(items)
        return p.EmbeddingResponse(data=data, model=req.model or record.id, usage=p.EmbeddingUsage(prompt_tokens=n_tokens, total_tokens=n_tokens))

    # -- models ----------------------------------------------------------------------------
    @app.get("/v1/models", response_model=p.ModelList, tags=["models"])
    async def list_models() -> Any:
        records = await asyncio.to_thread(store.list)
        return p.ModelList(data=[p.Model(id=r.id, created=r.created, owned_by=r.owned_by) for r in records])

    try:
        # Downloads and conversions live in their own module; without it the routes say so.
        from conch.web import model_ops
    except ImportError:
        model_ops = None  # type: ignore[assignment]
    if model_ops is not None:
        app.include_router(model_ops.router(settings, store, details))
    else:
        @app.post("/v1/models/{model_id:path}/download", status_code=201, response_model=p.ModelDetails, responses={**ERRORS, 501: {"model": p.ErrorResponse, "description": "Not available yet"}}, tags=["models"])
        async def download_model(model_id: str, req: p.DownloadRequest | None = None) -> Any:
            raise APIError(
                501,
                "Model download is not available in this version of conch yet; "
                "the bundled model and models registered in the store can be used",
                code="not_implemented",
            )

        @app.post("/v1/models/{model_id:path}/convert", status_code=201, response_model=p.ModelDetails, responses={**ERRORS, 501: {"model": p.ErrorResponse, "description": "Not available yet"}}, tags=["models"])
        async def convert_model(model_id: str, req: p.ConvertRequest | None = None) -> Any:
            raise APIError(
                501, "Model conversion is not available in this version of conch yet", code="not_implemented"
            )

    @app.get("/v1/models/{model_id:path}", response_model=p.ModelDetails, responses=ERRORS, tags=["models"])
    async def get_model(model_id: str) -> Any:
        record = await asyncio.to_thread(store.get, manager.local_id(model_id))
        if record is None:
            raise APIError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
        return details(record)

    @app.delete("/v1/models/{model_id:path}", response_model=p.ModelDeleted, responses={**ERRORS, 409: {"model": p.ErrorResponse, "description": "Model in use"}}, tags=["models"])
    async def delete_model(model_id: str) -> Any:
        mid = manager.local_id(model_id)
        record = await asyncio.to_thread(store.get, mid)
        if record is None:
            raise APIError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
        if record.status in ("downloading", "converting"):
            raise APIError(409, f"The model '{model_id}' is {record.status}; wait for it to finish", code="model_busy")
        if manager.in_use(mid):
            raise APIError(409, f"The model '{model_id}' is serving requests; try again when they finish", code="model_in_use")
        await manager.unload(mid)
        await asyncio.to_thread(store.delete, mid)
        return p.ModelDeleted(id=model_id, deleted=True)

    # -- providers -------------------------------------------------------------------------
    @app.get("/v1/providers", response_model=list[p.Provider], tags=["providers"])
    async def list_providers() -> Any:
        return [p.Provider(id="local", status="available")]

    @app.post("/v1/providers/{provider_id}/validate", response_model=p.ProviderValidation, responses=ERRORS, tags=["providers"])
    async def validate_provider(provider_id: str) -> Any:
        if provider_id != "local":
            raise APIError(404, f"Unknown provider '{provider_id}'; available: local", code="provider_not_found", param="provider_id")
        t0 = time.perf_counter()
        records = await asyncio.to_thread(store.list)
        ready = [r for r in records if r.status == "ready"]
        latency = round((time.perf_counter() - t0) * 1000)
        return p.ProviderValidation(provider="local", valid=True, latency_ms=latency, models_available=len(ready))

    # -- storage ---------------------------------------------------------------------------
    @app.get("/v1/storage/stats", response_model=p.StorageStats, tags=["storage"])
    async def storage_stats() -> Any:
        s = await asyncio.to_thread(store.stats)
        return p.StorageStats(**s.model_dump())

    @app.post("/v1/storage/cleanup", response_model=p.CleanupResult, tags=["storage"])
    async def storage_cleanup() -> Any:
        freed, removed = await asyncio.to_thread(store.cleanup)
        return p.CleanupResult(freed_bytes=freed, removed=removed)

    # -- health, status, metrics, docs ------------------------------------------------------
    @app.get("/v1/health", response_model=p.Health, tags=["health"])
    async def health() -> Any:
        return {"status": "ok"}

    @app.get("/v1/status", response_model=p.Status, tags=["health"])
    async def status() -> Any:
        return p.Status(
            version=conch.__version__,
            uptime_seconds=int(time.time() - started),
            providers={"local": "connected"},
            models_loaded=len(manager.loaded_ids()),
            requests_served=app.state.requests_served,
        )

    @app.get("/metrics", response_class=PlainTextResponse, include_in_schema=True, tags=["health"])
    async def metrics() -> Any:
        return PlainTextResponse(_render_metrics(app.state.metrics, manager), media_type="text/plain; version=0.0.4")

    if settings.enable_openapi:
        from starlette.staticfiles import StaticFiles
        from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

        app.mount("/swagger-ui/assets", StaticFiles(directory=str(swagger_ui_path)), name="swagger-assets")

        @app.get("/swagger-ui", response_class=HTMLResponse, include_in_schema=False)
        async def swagger_ui() -> HTMLResponse:
            return get_swagger_ui_html(
                openapi_url="/api-docs/openapi.json",
                title="conch inference server",
                swagger_js_url="/swagger-ui/assets/swagger-ui-bundle.js",
                swagger_css_url="/swagger-ui/assets/swagger-ui.css",
                swagger_favicon_url="/swagger-ui/assets/favicon-32x32.png",
            )

    @app.get("/", include_in_schema=False)
    async def root() -> JSONResponse:
        return JSONResponse({"name": "conch inference server", "version": conch.__version__, "api": "/v1", "docs": "/swagger-ui"})

    mount_studio(app, INFERENCE_PAGES)
    return app


def _choice(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}


def _event_chunk(ev: ChatEvent, chunk: Any) -> str:
    if ev.kind == "delta":
        return str(chunk([_choice(ev.index, {"content": ev.text})]))
    if ev.kind == "tool_calls":
        deltas = [
            {"index": k, "id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for k, c in enumerate(ev.tool_calls or [])
        ]
        return str(chunk([_choice(ev.index, {"tool_calls": deltas})]))
    return str(chunk([_choice(ev.index, {}, ev.finish_reason)]))


def _render_metrics(m: Metrics, manager: ModelManager) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value}")

    metric(
        "conch_inference_requests_total", "counter", "HTTP requests served, by method, route and status.",
        [(f'{{method="{k[0]}",route="{k[1]}",status="{k[2]}"}}', v) for k, v in sorted(m.requests.items())],
    )
    metric("conch_inference_prompt_tokens_total", "counter", "Tokens read (prompts and embedding inputs).", [("", m.prompt_tokens)])
    metric("conch_inference_completion_tokens_total", "counter", "Tokens generated.", [("", m.completion_tokens)])
    engines = manager.engines()
    metric(
        "conch_inference_generated_tokens_total", "counter", "Tokens sampled by the engines (including cancelled streams).",
        [("", sum(e.stats.completion_tokens for e in engines) + manager.unloaded_completion_tokens)],
    )
    metric("conch_inference_time_to_first_token_seconds", "summary", "Time from request to first generated output.",
           [("_sum", m.ttft_sum), ("_count", m.ttft_count)])
    metric("conch_inference_generation_seconds_total", "counter", "Wall time of completed generations.", [("", m.gen_seconds)])
    metric("conch_inference_tokens_per_second", "gauge", "Decode rate of the last completed generation.", [("", m.last_tokens_per_second)])
    metric("conch_inference_queue_depth", "gauge", "Requests waiting for a free sequence.", [("", sum(e.queued for e in engines))])
    metric("conch_inference_active_sequences", "gauge", "Sequences being generated now.", [("", sum(e.active_sequences for e in engines))])
    metric("conch_inference_models_loaded", "gauge", "Models in memory.", [("", len(engines))])
    metric("conch_inference_embedded_inputs_total", "counter", "Inputs embedded.", [("", m.embedded_inputs)])
    return "\n".join(lines) + "\n"
