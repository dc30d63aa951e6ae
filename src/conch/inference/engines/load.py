"""Model runtimes behind one seam (:class:`~conch.inference.engines.base.Engine`).

:func:`load_engine` is the one place that maps a model's format to its runtime; runtimes are
imported only when a model of their format loads, so optional extras stay optional.
"""

from __future__ import annotations

from conch.config import Settings
from conch.inference.engines.base import Engine, Unsupported
from conch.inference.models.store import ModelRecord

SERVED_FORMATS = ("gguf", "onnx")


def load_engine(record: ModelRecord, settings: Settings, *, n_ctx: int | None = None) -> Engine:
    """A loaded engine for ``record`` (blocking; raises ``RuntimeMissing`` without the extra).

    ``n_ctx``: the context the loader chose for it (e.g. lowered to fit a memory budget:
    ``engines.llama.footprint.fit_context``); None: the settings' (``n_ctx``, per model too;
    0 is the model's own)."""
    if record.format == "onnx":
        from conch.inference.engines.onnx import OnnxEmbeddingEngine

        limit = n_ctx or settings.n_ctx
        return OnnxEmbeddingEngine(
            record.path, model_id=record.id, n_threads=settings.n_threads_batch,
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
            n_threads=settings.n_threads,
            n_threads_batch=settings.n_threads_batch,
            n_parallel=settings.n_parallel,
            cache_prompt=settings.cache_prompt,
            max_queue=settings.max_queue,
            draft_max=settings.draft_max,
            runtime=runtime,
            prompt_cache_dir=settings.data_dir / "kv-cache",
            prompt_cache_max_bytes=settings.prompt_cache_disk_mb << 20,
            prompt_cache_min_tokens=settings.prompt_cache_min_tokens,
        )
        engine.load()
        return engine
    raise Unsupported(f"no engine serves the {record.format} format (served: {', '.join(SERVED_FORMATS)})")
