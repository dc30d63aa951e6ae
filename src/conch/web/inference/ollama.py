"""Ollama's API on the inference server: ``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``,
``/api/delete``.

Streams are NDJSON (one object a line), on by default as in Ollama; errors are Ollama's
``{"error": "..."}``. ``/api/pull`` goes through conch's download sources: a plain name is
pulled from the Ollama registry; conch's locator fields (``source`` with ``url``, ``path``,
``repo``, ``package``, ``revision``, ``files``, ``sha256``) pick any other source.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import conch
from conch.config import Settings
from conch.errors import DomainError
from conch.inference.api import ollama as o
from conch.inference.api.completions import CompletionRequest
from conch.inference.api.dialect import TranslationError
from conch.inference.api.openai import ChatCompletionRequest, EmbeddingRequest
from conch.inference.models.acquire import DownloadSpec
from conch.inference.models.sources import ModelOpError, get_source
from conch.inference.models.store import ModelStore
from conch.inference.serving.embeddings import EmbeddingServing
from conch.web.common.auth import principal_of
from conch.web.common.responses import compact_json
from conch.web.inference import audit
from conch.web.inference.compat import (
    BadRequest,
    Conflict,
    NotFound,
    chunks,
    primed,
    read_json,
    validated,
)
from conch.web.inference.deps import (
    AcquirerDep,
    ChatDep,
    CompletionDep,
    EmbeddingDep,
    ManagerDep,
    SettingsDep,
    StoreDep,
)
from conch.web.inference.errors import OLLAMA, OllamaRoute
from conch.web.inference.jobs import JobRun
from conch.web.inference.metering import allows, meter

router = APIRouter(tags=["ollama"], route_class=OllamaRoute)

NDJSON = "application/x-ndjson"
NDJSON_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _line(obj: dict[str, Any]) -> str:
    return compact_json(obj) + "\n"


def _body(description: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "description": description}}}}}


def _model_id(store: ModelStore, name: str) -> str:
    """Ollama clients add the default tag; conch ids have none."""
    if name.endswith(":latest") and store.get(name) is None:
        return name.removesuffix(":latest")
    return name


def _context_of(settings: Settings, store: ModelStore, model: str) -> int | None:
    """The context the model is served with (``n_ctx``, per model too; 0: its training
    context), for ``num_ctx``; None where it cannot be known before loading."""
    over = settings.model_overrides.get(model)
    n_ctx = over.n_ctx if over is not None and over.n_ctx else settings.n_ctx
    record = store.get(model) if model else None
    trained = record.context_length if record is not None else None
    if n_ctx > 0:
        return min(n_ctx, trained) if trained else n_ctx
    return trained


async def _read_model_request(request: Request, store: ModelStore) -> dict[str, Any]:
    """The JSON body, its ``model`` named as in conch's store."""
    body = await read_json(request)
    body["model"] = _model_id(store, str(body.get("model") or ""))
    return body


async def _generation(kind: str, model: str, stream_out: bool, start: float, chunk_source: Callable[[], Any]) -> Any:
    """Serve one chat/generate request from its chat or completion chunks."""
    first, stream = await primed(chunk_source())
    t_first = time.perf_counter()
    translator = o.OllamaStream(model, kind)

    def final(collected: bool) -> dict[str, Any]:
        end = time.perf_counter()
        return translator.final(total_ns=int((end - start) * 1e9), prompt_ns=int((t_first - start) * 1e9),
                                eval_ns=int((end - t_first) * 1e9), collected=collected)

    if not stream_out:
        async for chunk in chunks(first, stream):
            translator.feed(chunk)
        return JSONResponse(final(True))

    async def lines() -> AsyncIterator[str]:
        try:
            async for chunk in chunks(first, stream):
                for obj in translator.feed(chunk):
                    yield _line(obj)
        except DomainError as exc:
            yield _line(OLLAMA.body(exc))
            return
        yield _line(final(False))

    return StreamingResponse(lines(), media_type=NDJSON, headers=NDJSON_HEADERS)


@router.post("/api/chat", openapi_extra=_body("An Ollama chat request"), summary="Ollama chat")
async def chat(request: Request, serving: ChatDep, settings: SettingsDep, store: StoreDep) -> Any:
    start = time.perf_counter()
    body = await _read_model_request(request, store)
    req = validated(ChatCompletionRequest, o.chat_request(body, _context_of(settings, store, body["model"])))
    stream_out = body.get("stream", True) is not False
    budget = meter(request, req.model, serving.providers)
    return await _generation("chat", body["model"], stream_out, start,
                             lambda: serving.stream(req, meter=budget))


@router.post("/api/generate", openapi_extra=_body("An Ollama generate request"), summary="Ollama generate")
async def generate(request: Request, chat: ChatDep, completions: CompletionDep, settings: SettingsDep,
                   store: StoreDep, manager: ManagerDep) -> Any:
    start = time.perf_counter()
    body = await _read_model_request(request, store)
    stream_out = body.get("stream", True) is not False
    if not body["model"]:
        raise TranslationError("model is required", "model")
    budget = meter(request, body["model"], chat.providers)
    if not body.get("prompt") and not body.get("suffix"):
        # An empty prompt loads the model and answers at once (Ollama's preload idiom).
        async with manager.use(body["model"], body.get("keep_alive")):
            pass
        done = {"model": body["model"], "created_at": o.now_iso(), "response": "", "done": True,
                "done_reason": "load"}
        return JSONResponse(done) if not stream_out else StreamingResponse(iter([_line(done)]), media_type=NDJSON)
    kind, translated = o.generate_request(body, _context_of(settings, store, body["model"]))
    if kind == "chat":
        source: Callable[[], Any] = functools.partial(
            chat.stream, validated(ChatCompletionRequest, translated), meter=budget)
    else:
        source = functools.partial(completions.stream, validated(CompletionRequest, translated),
                                   chat_logprobs=True, meter=budget)  # fmt: skip
    return await _generation("generate", body["model"], stream_out, start, source)


async def _embed(request: Request, serving: EmbeddingServing, store: ModelStore, legacy: bool) -> Any:
    start = time.perf_counter()
    body = await _read_model_request(request, store)
    if legacy and not isinstance(body.get("prompt"), str):
        raise TranslationError("'prompt' must be a string", "prompt")
    req = validated(EmbeddingRequest, o.embed_request(body))
    result = await serving.create(req, meter(request, req.model, serving.providers))
    total = int((time.perf_counter() - start) * 1e9)
    answer = o.embed_response(body["model"], result, total)
    if legacy:
        return {"embedding": answer["embeddings"][0]}
    return answer


@router.post("/api/embed", openapi_extra=_body("An Ollama embed request"), summary="Ollama embed")
async def embed(request: Request, serving: EmbeddingDep, store: StoreDep) -> Any:
    return await _embed(request, serving, store, legacy=False)


@router.post("/api/embeddings", openapi_extra=_body("A legacy Ollama embeddings request"),
             summary="Ollama embeddings (legacy)")
async def embeddings(request: Request, serving: EmbeddingDep, store: StoreDep) -> Any:
    return await _embed(request, serving, store, legacy=True)


# -- models ----------------------------------------------------------------------------------
def _usable(record: Any) -> bool:
    return bool(record.status == "ready" and record.capabilities)


@router.get("/api/tags", summary="Ollama: local models")
async def tags(store: StoreDep, request: Request) -> Any:
    """The models the key may use."""
    principal = principal_of(request)
    records = await asyncio.to_thread(store.list)
    return {"models": [o.tag_entry(r) for r in records
                       if _usable(r) and allows(principal, r.id, None)]}  # fmt: skip


async def _record(store: ModelStore, body: dict[str, Any]) -> Any:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required", where="model")
    record = await asyncio.to_thread(store.get, _model_id(store, name))
    if record is None:
        raise NotFound(f"model '{name}' not found", where="model")
    return record


@router.post("/api/show", openapi_extra=_body("{model}"), summary="Ollama: model details")
async def show(request: Request, store: StoreDep) -> Any:
    record = await _record(store, await read_json(request))
    template = ""
    fim = False
    if record.format == "gguf" and record.path:
        from conch.inference.models.gguf_info import read_gguf_info

        info = await asyncio.to_thread(read_gguf_info, record.path)
        template = info.chat_template or ""
        meta = info.metadata
        fim = all(f"tokenizer.ggml.fim_{k}_token_id" in meta for k in ("pre", "suf", "mid"))
    return o.show_entry(record, template=template, fim=fim)


@router.get("/api/ps", summary="Ollama: loaded models")
async def ps(manager: ManagerDep) -> Any:
    """Ollama's fields: ``size`` is the memory the model holds as the budget counts it (as
    measured when it loaded), ``size_vram`` the part of it on a GPU, ``context_length`` the
    context it was loaded with; ``GET /v1/models/{id}`` breaks the footprint down."""
    out = []
    for model_id in manager.loaded_ids():
        entry = manager.loaded(model_id)
        if entry is None:
            continue
        where = manager.placement(model_id)
        vram = entry.measured.device_bytes if entry.measured.total_bytes is not None else None
        if vram is None and where is not None:
            vram = where.get("vram_bytes")
        out.append(o.ps_entry(entry.record, manager.expires_at(entry), size=entry.bytes, size_vram=int(vram or 0),
                              context_length=getattr(entry.engine, "n_ctx", None)))
    return {"models": out}


@router.get("/api/version", summary="Ollama: server version")
async def version() -> Any:
    return {"version": conch.__version__}


@router.delete("/api/delete", openapi_extra=_body("{model}"), summary="Ollama: delete a model")
async def delete(request: Request, store: StoreDep, manager: ManagerDep) -> Any:
    record = await _record(store, await read_json(request))
    if record.status in ("downloading", "converting"):
        raise Conflict(f"model '{record.id}' is {record.status}; wait for it to finish")
    if manager.in_use(record.id):
        raise Conflict(f"model '{record.id}' is serving requests; try again when they finish")
    await manager.unload(record.id)
    await asyncio.to_thread(store.delete, record.id)
    await audit.model_deleted(request, record.id)
    return Response(status_code=200)


_LOCATORS = ("source", "revision", "files", "repo", "url", "package", "name", "path", "registry", "sha256")


@router.post("/api/pull", openapi_extra=_body("{model, stream?} plus conch's download fields (source, url, path …)"),
             summary="Ollama: pull a model through conch's download sources")
async def pull(request: Request, acquirer: AcquirerDep) -> Any:
    body = await read_json(request)
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required", where="model")
    fields: dict[str, Any] = {k: body[k] for k in _LOCATORS if body.get(k) is not None}
    source = str(fields.pop("source", "ollama"))
    if source == "ollama":
        fields.setdefault("name", model)
        model = model.removesuffix(":latest")
    if isinstance(fields.get("files"), str):
        fields["files"] = [fields["files"]]
    get_source(source)  # an unknown source: its 400, before anything starts
    spec = DownloadSpec(source=source, **fields)
    if acquirer.busy(model):
        raise Conflict(f"model '{model}' is already being downloaded")

    if body.get("stream", True) is False:
        await asyncio.to_thread(acquirer.download, model, spec)
        await audit.model_pulled(request, model, source, name=fields.get("name"))
        return {"status": "success"}

    async def lines() -> AsyncIterator[str]:
        run = JobRun(functools.partial(acquirer.download, model, spec))
        try:
            yield _line({"status": "pulling manifest"})
            async for event in run.progress():
                yield _line(o.pull_progress(event, model))
            try:
                record = run.result()
            except ModelOpError as exc:
                yield _line(o.error_body(exc.message))
                return
            except Exception as exc:
                yield _line(o.error_body(f"pull failed: {exc}"))
                return
            await audit.model_pulled(request, model, source, name=fields.get("name"))
            if record.sha256:
                yield _line({"status": "verifying sha256 digest", "digest": f"sha256:{record.sha256}"})
            yield _line({"status": "writing manifest"})
            yield _line({"status": "success"})
        finally:
            run.stop()  # a client that leaves stops the download at its next progress report

    return StreamingResponse(lines(), media_type=NDJSON, headers=NDJSON_HEADERS)


def _not_here(route: str, instead: str) -> Callable[[], Any]:
    async def handler() -> Any:
        return JSONResponse(o.error_body(f"{route} is not supported by conch; {instead}"), status_code=501)
    return handler


for _method, _route, _instead in (
    ("POST", "/api/create", "download a GGUF with /api/pull or POST /v1/models/:id/download, convert with /v1/models/:id/convert"),
    ("POST", "/api/copy", "download the model again under the new name"),
    ("POST", "/api/push", "conch does not publish models to a registry"),
):
    router.add_api_route(_route, _not_here(_route, _instead), methods=[_method], summary=f"Ollama: {_route} (not supported)",
                         status_code=501)
