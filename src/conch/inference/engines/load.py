"""Model runtimes behind one seam (:class:`~conch.inference.engines.base.Engine`).

:func:`load_engine` is the one place that maps a model's format to its runtime; runtimes are
imported only when a model of their format loads, so optional extras stay optional.
:func:`load_plan` says, before anything loads, what a load will ask the runtime for (context,
KV cells, micro-batch), which is what the model manager's memory estimate is made from, and
:func:`load_measured` loads and reports what the runtime allocated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.inference.engines.base import Engine, Unsupported
from conch.inference.models.store import ModelRecord

SERVED_FORMATS = ("gguf", "onnx")


def _override(settings: Settings, model_id: str, name: str) -> Any:
    """``model_overrides[model_id].name`` when set, else the server-wide setting."""
    over = settings.model_overrides.get(model_id)
    value = getattr(over, name, None) if over is not None else None
    return getattr(settings, name) if value is None else value


def projector_path(record: ModelRecord, settings: Settings) -> str | None:
    """The model's vision projector (mmproj) file: model_overrides.<id>.mmproj (relative to the
    model file's directory unless absolute), else the one learned with the model; None: text only."""
    over = settings.model_overrides.get(record.id)
    path = over.mmproj if over is not None and over.mmproj else record.mmproj
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute() and record.path:
        p = Path(record.path).parent / p
    return str(p)


@dataclass(frozen=True)
class LoadPlan:
    """What a load asks the runtime for, per-model overrides applied (a GGUF model's)."""

    n_ctx: int  # tokens one sequence may hold
    kv_cells: int  # KV cache cells of the context, every sequence together
    n_parallel: int
    n_ubatch: int
    flash_attn: bool
    kv_cache_type: str
    n_gpu_layers: int
    n_threads: int | None
    n_threads_batch: int | None


def load_plan(record: ModelRecord, settings: Settings, n_ctx_train: int | None) -> LoadPlan:
    """The context a GGUF model will get, as the llama.cpp engine sizes it (LlamaEngine.load):
    ``n_ctx`` capped by the training context (0: the training context, lowered to fit the
    machine as llama-server's --fit), one KV pool of ``n_ctx`` cells that every sequence
    shares. Kept beside the engine's arithmetic: change both together."""
    from conch.inference.engines.llama.footprint import default_context, resolve_n_ctx
    from conch.inference.engines.llama.offload import runtime_options

    runtime = runtime_options(settings, record.id)
    n_parallel = max(1, settings.n_parallel)
    n_ctx = 0
    if runtime.n_ctx <= 0 and not runtime.on_gpu:  # the training context, fitted to the machine
        n_ctx = default_context(record.path, runtime, n_seqs=n_parallel, draft_max=settings.draft_max)
    n_ctx = n_ctx or resolve_n_ctx(runtime.n_ctx, n_ctx_train or 0)
    return LoadPlan(
        n_ctx=n_ctx, kv_cells=n_ctx, n_parallel=n_parallel,
        # llama.cpp caps the prompt batch at the context, and the micro-batch at the batch.
        n_ubatch=min(runtime.n_batch, runtime.n_ubatch, n_ctx), flash_attn=runtime.flash_attn != "off",
        kv_cache_type=runtime.kv_cache_type, n_gpu_layers=runtime.n_gpu_layers if runtime.on_gpu else 0,
        n_threads=_override(settings, record.id, "n_threads"),
        n_threads_batch=_override(settings, record.id, "n_threads_batch"),
    )


def load_engine(record: ModelRecord, settings: Settings, *, n_ctx: int | None = None) -> Engine:
    """A loaded engine for ``record`` (blocking; raises ``RuntimeMissing`` without the extra).

    ``n_ctx``: the context the loader chose for it (e.g. lowered to fit a memory budget:
    ``engines.llama.footprint.fit_context``); None: the settings' (``n_ctx``, per model too;
    0 is the model's own)."""
    n_threads = _override(settings, record.id, "n_threads")
    n_threads_batch = _override(settings, record.id, "n_threads_batch")
    if record.format == "onnx":
        from conch.inference.engines.onnx import OnnxEmbeddingEngine

        limit = n_ctx or _override(settings, record.id, "n_ctx")
        return OnnxEmbeddingEngine(
            record.path, model_id=record.id, n_threads=n_threads_batch,
            max_length=limit if limit > 0 else 1 << 30,  # 0: the model's own (max_position_embeddings)
        )
    if record.format == "gguf":
        from conch.inference.engines.llama.engine import LlamaEngine
        from conch.inference.engines.llama.offload import runtime_options

        # GPU offload and the rest of the per-model settings (docs/gpu.md)
        runtime = runtime_options(settings, record.id)
        engine = LlamaEngine(
            record.id,
            record.path,
            n_ctx=runtime.n_ctx if n_ctx is None else n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads_batch,
            n_parallel=settings.n_parallel,
            cache_prompt=settings.cache_prompt,
            max_queue=settings.max_queue,
            draft_max=settings.draft_max,
            runtime=runtime,
            prompt_cache_dir=settings.data_dir / "kv-cache",
            prompt_cache_max_bytes=settings.prompt_cache_disk_mb << 20,
            prompt_cache_min_tokens=settings.prompt_cache_min_tokens,
            mmproj=projector_path(record, settings) if "chat" in record.capabilities else None,
        )
        engine.load()
        return engine
    raise Unsupported(f"no engine serves the {record.format} format (served: {', '.join(SERVED_FORMATS)})")


@dataclass
class Measured:
    """What a load (or a later call) allocated: ``None`` where it could not be told."""

    total_bytes: int | None = None
    device_bytes: int | None = None  # of which on a GPU
    by_kind: dict[str, int] | None = None


@contextlib.contextmanager
def measuring(fmt: str) -> Iterator[Measured]:
    """What the runtime of ``fmt`` allocates on this thread inside the block.

    llama.cpp's own buffer sizes for a GGUF model (its load log: weights, KV cache, compute
    and output buffers); for any other runtime, the growth of the process's resident memory
    across the block, which counts whatever else the process allocated meanwhile."""
    out = Measured()
    if fmt == "gguf":
        from conch.inference.engines.llama.memory import allocations

        with allocations() as seen:
            yield out
        if seen.lines:
            out.total_bytes, out.device_bytes, out.by_kind = seen.total_bytes, seen.device_bytes, dict(seen.by_kind)
        return
    before = _resident_bytes()
    yield out
    after = _resident_bytes()
    if before is not None and after is not None:
        out.total_bytes, out.device_bytes = max(0, after - before), 0


def load_measured(record: ModelRecord, settings: Settings) -> tuple[Engine, Measured]:
    """:func:`load_engine`, and what the load allocated (:func:`measuring`)."""
    with measuring(record.format) as measured:
        engine = load_engine(record, settings)
    return engine, measured


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
