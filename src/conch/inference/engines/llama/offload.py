"""How a llama.cpp model is placed: the settings resolved per model, and whether it fits the GPU.

Defaults follow llama-server and Ollama: with a GPU backend compiled in, every layer is
offloaded; without one, none. A model that does not fit the free GPU memory is not refused and
does not crash the server: it is loaded with as many layers as fit (the rest run on the CPU),
and the log says so. The estimate (weights per layer from the GGUF's tensor sizes, the KV
cache from its shape, a fixed margin for compute buffers) errs on the side of fewer layers, and
if llama.cpp still fails to allocate, loading is retried with fewer layers, down to none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# llama.cpp's micro-batch, as llama-server's default. On a GPU a 64-stream decode step is one
# micro-batch instead of two (+12 % aggregate at 64 streams, a quarter of the first-token time
# under 16-stream load; H100, 2026-11-22). On the CPU a prompt's micro-batches of 512 run ggml's
# tiled flash attention (~1.5x the prefill of micro-batches under 64: docs/inference.md).
CPU_UBATCH = GPU_UBATCH = 512
# Prompt tokens the scheduler hands llama.cpp in one step (llama.cpp's logical batch, n_batch).
# On a GPU, llama-server's 2048: a step of a few hundred tokens costs a GPU little more than a
# decode step, so a burst of prompts is prefilled in one or two steps, not eight. On the CPU a
# step's time grows with its tokens, and 512 keeps a prompt from holding up the streams that are
# generating for long.
CPU_BATCH, GPU_BATCH = 512, 2048
# Prompt tokens per step while other sequences are generating (chunked prefill) on the CPU; on a
# GPU one micro-batch (n_ubatch), which costs the generating streams about one decode step.
CPU_PREFILL_CHUNK = 128
# Below 64 query rows ggml's CPU flash attention keeps to one kernel whose rows do not depend on
# how they were batched (from 64 it switches to a tiled one that depends on the split and on
# where cells sit): the CPU's micro-batch with ``batch_invariant``.
EXACT_UBATCH = 63


def cpu_attention(flash_attn: str, batch_invariant: bool = False) -> tuple[str, int]:
    """``flash_attn`` on the CPU, ``auto`` resolved, with its default micro-batch.

    ``auto`` is on: ggml's CPU flash attention skips the cells a row may not see, so several
    streams in the unified KV pool each attend over their own cells only; plain attention
    computes every row over every sequence's cells, and so took more time at 4 and 8 streams
    (2026-11-26: 113–131 against 133–157 tokens/s). Its micro-batch is llama-server's 512:
    prompts then run the tiled kernel, ~1.5x the prefill of micro-batches under 64 rows; a
    reused prefix gives the greedy tokens a fresh prefill gives up to near-ties (tests/inference/
    test_prefix_reuse_tokens.py). ``batch_invariant`` keeps every micro-batch under 64 rows,
    where each token's logits are bitwise the same however its prompt was split or reused;
    ``off`` is that at any micro-batch and takes 512 (docs/inference.md, "Prefill and prefix
    reuse")."""
    if flash_attn == "off":
        return "off", CPU_UBATCH
    return "on", EXACT_UBATCH if batch_invariant else CPU_UBATCH

# Compute buffers, CUDA graphs and the driver's own share: kept free when planning.
_MARGIN_BYTES = 768 * 1024 * 1024
_KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}  # per element (q8_0: 32 values in 34 bytes)


@dataclass(frozen=True)
class RuntimeOptions:
    """The settings of one model, per-model overrides applied and ``auto`` values resolved."""

    n_gpu_layers: int  # -1: every layer; 0: CPU only
    main_gpu: int
    flash_attn: str  # auto | on | off
    kv_cache_type: str  # f16 | q8_0
    n_ubatch: int
    n_ctx: int
    gpu_backend: bool  # llama.cpp has a GPU backend compiled in
    draft_model: str | None = None  # another local model's id proposing speculative drafts
    draft_path: str | None = None  # its GGUF file; None: no ready local GGUF model has that id
    n_batch: int = CPU_BATCH  # prompt tokens per step (llama.cpp's n_batch)
    batch_invariant: bool = False  # logits bitwise independent of batching (docs/inference.md)

    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens per step while other sequences generate (chunked prefill)."""
        return min(self.n_batch, self.n_ubatch if self.on_gpu else CPU_PREFILL_CHUNK)

    @property
    def on_gpu(self) -> bool:
        return self.gpu_backend and self.n_gpu_layers != 0


def runtime_options(settings: Any, model_id: str, *, gpu_backend: bool | None = None) -> RuntimeOptions:
    """``settings`` with ``settings.model_overrides[model_id]`` on top, ``None`` values resolved."""
    if gpu_backend is None:
        from conch.inference.engines.llama.device import gpu_offload_supported

        gpu_backend = gpu_offload_supported()
    over = getattr(settings, "model_overrides", {}).get(model_id)

    def pick(name: str) -> Any:
        value = getattr(over, name, None) if over is not None else None
        return getattr(settings, name) if value is None else value

    layers = pick("n_gpu_layers")
    if layers is None:
        layers = -1 if gpu_backend else 0
    if not gpu_backend:
        layers = 0  # nothing to offload to: say so instead of pretending
    draft = getattr(over, "draft_model", None) if over is not None else None
    flash_attn, ubatch = str(pick("flash_attn")), pick("n_ubatch")
    invariant = bool(pick("batch_invariant"))
    if layers == 0:
        flash_attn, cpu_ubatch = cpu_attention(flash_attn, invariant)
        ubatch = cpu_ubatch if ubatch is None else ubatch
    elif ubatch is None:
        ubatch = GPU_UBATCH
    batch = pick("n_batch")
    if batch is None:
        batch = CPU_BATCH if layers == 0 else GPU_BATCH
    return RuntimeOptions(
        n_gpu_layers=int(layers), main_gpu=int(pick("main_gpu")), flash_attn=flash_attn,
        kv_cache_type=str(pick("kv_cache_type")), n_ubatch=max(1, int(ubatch)), n_ctx=int(pick("n_ctx")),
        gpu_backend=gpu_backend, draft_model=draft, draft_path=draft_model_path(settings, draft) if draft else None,
        n_batch=max(1, int(batch)), batch_invariant=invariant,
    )


def draft_model_path(settings: Any, model_id: str) -> str | None:
    """The GGUF file of the local model ``model_id`` (``local:`` prefix allowed) from the model
    store, as the server finds a model's file; None unless it is a ready GGUF model."""
    from conch.inference.models.store import ModelStore

    try:
        record = ModelStore(settings).find(model_id)
    except Exception as exc:  # settings without a store (tests): the engine reports the id unknown
        log.debug("no model store to look up draft model %s: %s", model_id, exc)
        return None
    if record is None or record.status != "ready" or record.format != "gguf" or not record.path:
        return None
    return record.path


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs from a GGUF: its layers' bytes, the output layer's, and the KV width."""

    n_layer: int
    layer_bytes: int  # all repeating blocks together
    output_bytes: int
    kv_width: int  # K and V elements per token per layer
    # For the host-memory footprint (footprint.py): every tensor's bytes, the training context,
    # and the widths that size llama.cpp's compute buffers.
    total_bytes: int = 0
    n_ctx_train: int = 0
    n_vocab: int = 0
    n_embd: int = 0
    n_ff: int = 0

    def kv_bytes(self, n_tokens: int, kv_type: str, layers: int | None = None) -> int:
        n = self.n_layer if layers is None else layers
        return int(n_tokens * n * self.kv_width * _KV_BYTES.get(kv_type, 2.0))

    def need_bytes(self, layers: int, n_tokens: int, kv_type: str) -> int:
        """GPU memory for ``layers`` offloaded blocks (every block: the output layer too)."""
        layers = min(max(layers, 0), self.n_layer)
        weights = self.layer_bytes * layers // max(self.n_layer, 1)
        if layers >= self.n_layer:
            weights += self.output_bytes
        return weights + self.kv_bytes(n_tokens, kv_type, layers) + _MARGIN_BYTES


def read_shape(path: str | Path) -> ModelShape | None:
    """The model's shape from its GGUF header (tensors are not read); None if it cannot tell."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path), "r")
        arch_f = reader.fields.get("general.architecture")
        if arch_f is None:
            return None
        arch = str(arch_f.contents())

        def num(key: str) -> int | None:
            f = reader.fields.get(f"{arch}.{key}")
            if f is None:
                return None
            v = f.contents()
            if isinstance(v, list):  # per-layer values (some architectures): the largest
                v = max(v) if v else None
            return int(v) if v is not None else None

        n_layer = num("block_count")
        n_embd = num("embedding_length")
        n_head = num("attention.head_count") or 1
        n_head_kv = num("attention.head_count_kv") or n_head
        if not n_layer or not n_embd:
            return None
        k_len = num("attention.key_length") or n_embd // n_head
        v_len = num("attention.value_length") or n_embd // n_head
        layer_bytes = output_bytes = embd_bytes = total = 0
        n_vocab = 0
        for t in reader.tensors:
            total += int(t.n_bytes)
            if t.name == "token_embd.weight":
                n_vocab = int(max(t.shape)) if len(t.shape) else 0
            if t.name.startswith("blk."):
                layer_bytes += int(t.n_bytes)
            elif t.name.startswith("output."):
                output_bytes += int(t.n_bytes)
            elif t.name == "token_embd.weight":
                embd_bytes = int(t.n_bytes)
        # Tied embeddings: the output layer reuses token_embd, which then goes to the GPU too.
        return ModelShape(n_layer, layer_bytes, output_bytes or embd_bytes, n_head_kv * (k_len + v_len),
                          total_bytes=total, n_ctx_train=num("context_length") or 0, n_vocab=n_vocab,
                          n_embd=n_embd, n_ff=num("feed_forward_length") or 4 * n_embd)
    except Exception:
        return None


@dataclass(frozen=True)
class OffloadPlan:
    n_gpu_layers: int  # what to ask llama.cpp for first (-1: all)
    n_layer: int | None
    reason: str  # one line for the log and for `conch models show`
    fits: bool


def plan_offload(opts: RuntimeOptions, shape: ModelShape | None, kv_tokens: int,
                 free_bytes: int | None, device: str = "the GPU",
                 draft: ModelShape | None = None) -> OffloadPlan:
    """How many layers to offload, given the free GPU memory (None: unknown, trust the setting).

    ``draft``: the draft model's shape when it loads beside this one. It is opened with the
    same number of GPU layers and a KV cache of as many cells, so its weights and cache count
    against the same free memory; the plan leaves room for both."""
    if not opts.on_gpu:
        why = "no GPU backend in this llama.cpp build" if not opts.gpu_backend else "n_gpu_layers = 0"
        return OffloadPlan(0, shape.n_layer if shape else None, f"runs on the CPU ({why})", True)
    if shape is None or free_bytes is None:
        return OffloadPlan(opts.n_gpu_layers, shape.n_layer if shape else None,
                           "offloaded as configured (free GPU memory unknown)", True)

    def need_for(layers: int) -> int:
        need = shape.need_bytes(layers, kv_tokens, opts.kv_cache_type)
        if draft is not None and layers > 0:
            # The margin for compute buffers is counted once, with the target's.
            need += draft.need_bytes(min(layers, draft.n_layer), kv_tokens, opts.kv_cache_type) - _MARGIN_BYTES
        return need

    with_draft = f" with its draft model {opts.draft_model}" if draft is not None else ""
    want = shape.n_layer if opts.n_gpu_layers < 0 else min(opts.n_gpu_layers, shape.n_layer)
    need = need_for(want)
    if need <= free_bytes:
        return OffloadPlan(opts.n_gpu_layers, shape.n_layer,
                           f"{want} of {shape.n_layer} layers on {device}{with_draft} "
                           f"(~{_gib(need)} of {_gib(free_bytes)} free)",
                           True)
    fit = want
    while fit > 0 and need_for(fit) > free_bytes:
        fit -= 1
    placed = (f"{fit} of {shape.n_layer} layers offloaded, the rest run on the CPU" if fit
              else "it runs on the CPU")
    return OffloadPlan(
        fit, shape.n_layer,
        f"does not fit on {device}: {want} layers{with_draft} need ~{_gib(need)}, {_gib(free_bytes)} free; {placed} "
        "(n_gpu_layers, n_ctx and kv_cache_type = \"q8_0\" change this)",
        False,
    )


def fallback_layers(first: int, n_layer: int | None) -> Iterator[int]:
    """Layer counts to try in turn when llama.cpp fails to allocate: first, then halving, then 0."""
    yield first
    layers = n_layer if first < 0 and n_layer else first
    if layers < 0:  # unknown layer count: straight to the CPU
        layers = 0
    while layers > 1:
        layers //= 2
        yield layers
    if first != 0:
        yield 0


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


# -- loading with the plan ----------------------------------------------------------------------


@dataclass
class Placement:
    """Where a loaded model runs (``GET /v1/models/{id}``, ``conch models show``)."""

    device: str  # "cpu", or the backend and GPU names
    n_gpu_layers: int  # blocks on the GPU (resolved: never -1)
    n_layers: int | None
    vram_bytes: int | None  # GPU memory the load took (free memory before minus after)
    note: str  # the plan's line: why it runs where it runs

    @property
    def offload(self) -> str:
        if self.n_gpu_layers == 0:
            return "none"
        if self.n_layers is not None and self.n_gpu_layers < self.n_layers:
            return "partial"
        return "full"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "offload": self.offload}


def _gpus_free() -> tuple[int, str] | None:
    """Free bytes over every GPU llama.cpp sees (its default splits layers over all), and their names."""
    from conch.inference.engines.llama import device

    total_free, names = 0, []
    index = 0
    while (fm := device.gpu_free_bytes(index)) is not None:
        total_free += fm[0]
        names.append(f"GPU {index}")
        index += 1
    if not names:
        return None
    info = device.device_info()
    label = info.device if info.gpus else ", ".join(names)
    return total_free, label


def load_placed(model_id: str, path: str, opts: RuntimeOptions, kv_tokens: int,
                load: Callable[[int], Any], *, with_draft: bool = False) -> tuple[Any, Placement]:
    """Load with the planned number of GPU layers, falling back to fewer when llama.cpp cannot
    allocate: a model that does not fit the GPU never fails to load while the CPU can take it.

    ``load(n_gpu_layers)`` builds everything that allocates (model, contexts) and returns it, or
    frees what it built and raises. The last attempt (CPU only) raises what llama.cpp raised.
    """
    shape = read_shape(path) if opts.on_gpu else None
    draft = read_shape(opts.draft_path) if opts.on_gpu and with_draft and opts.draft_path else None
    before = _gpus_free() if opts.on_gpu else None
    plan = plan_offload(opts, shape, kv_tokens, before[0] if before else None, before[1] if before else "the GPU",
                        draft=draft)
    n_layer = plan.n_layer
    (log.info if plan.fits else log.warning)("model %s: %s", model_id, plan.reason)
    note = plan.reason
    failed: tuple[int, BaseException] | None = None
    for layers in fallback_layers(plan.n_gpu_layers, n_layer):
        if failed is not None:
            then = f"retrying with {layers} GPU layers" if layers else "running it on the CPU"
            note = f"llama.cpp could not allocate it with {failed[0]} GPU layers ({failed[1]}); {then}"
            log.warning("model %s: %s", model_id, note)
        try:
            loaded = load(layers)
        except Exception as exc:
            if layers == 0:
                raise
            failed = (layers, exc)
            continue
        resolved = layers if layers >= 0 else (n_layer if n_layer is not None else -1)
        if n_layer is not None:
            resolved = min(resolved, n_layer)
        vram = None
        if before is not None and resolved:
            after = _gpus_free()
            vram = max(0, before[0] - after[0]) if after else None
        from conch.inference.engines.llama import device

        where = device.device_info().device if resolved else "cpu"
        return loaded, Placement(where, resolved, n_layer, vram, note)
    raise AssertionError("unreachable: the last attempt runs on the CPU")


def gpu_shortfall(settings: Any, model_id: str, path: str) -> int:
    """Bytes of GPU memory missing to offload the model as configured (0: it fits, or it runs on
    the CPU, or nothing can be known). The model manager unloads idle models while this is > 0."""
    opts = runtime_options(settings, model_id)
    if not opts.on_gpu:
        return 0
    shape = read_shape(path)
    free = _gpus_free()
    if shape is None or free is None:
        return 0
    want = shape.n_layer if opts.n_gpu_layers < 0 else min(opts.n_gpu_layers, shape.n_layer)
    # One pool of n_ctx cells (0: the training context), as the engine opens it.
    kv_tokens = opts.n_ctx if opts.n_ctx > 0 else (shape.n_ctx_train or 4096)
    if shape.n_ctx_train:
        kv_tokens = min(kv_tokens, shape.n_ctx_train)
    return max(0, shape.need_bytes(want, kv_tokens, opts.kv_cache_type) - free[0])
