"""What a GGUF file says about itself: architecture, context length, quantization, chat template.

Read with the ``gguf`` package (memory-mapped; tensors are never loaded), so registering a
model is cheap and needs no llama.cpp context.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Architectures that are encoders only: they embed, they cannot chat.
EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "t5encoder", "modern-bert", "neo-bert"}
)

# What a chat template says when it takes tools: the ``tools`` variable (``{% if tools %}``), an
# assistant message's ``tool_calls``, a ``<tool_call>`` tag, or the ``tool`` role.
_TOOL_TEMPLATE = re.compile(r"""\btools\b|\btool_calls?\b|(['"])tool\1""")


def template_uses_tools(template: str | None) -> bool:
    """Whether a chat template refers to tools: the sign that the model was tuned to call them.

    conch's chat endpoint takes ``tools`` for every chat model (the tools are described in the
    system prompt, calls are ``<tool_call>`` text the sampler's grammar keeps to the tools'
    schemas, ``conch.inference.engines.tool_calls``), but a model never tuned on tool use rarely
    decides to call one unforced; such a model is not listed with ``tools``.
    """
    return template is not None and _TOOL_TEMPLATE.search(template) is not None


@dataclass
class GGUFInfo:
    architecture: str | None
    context_length: int | None
    quantization: str | None
    chat_template: str | None
    embedding_length: int | None
    name: str | None
    size_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def capabilities(self) -> list[str]:
        if self.architecture in EMBEDDING_ARCHITECTURES:
            return ["embeddings"]
        # A decoder can embed too (mean pooling over its hidden states).
        caps = ["chat", "embeddings"]
        if template_uses_tools(self.chat_template):
            caps.append("tools")
        return caps


def _field_value(f: Any) -> Any:
    contents = getattr(f, "contents", None)
    if callable(contents):
        return contents()
    # Older gguf releases: decode by hand from the raw parts.
    import gguf

    if not f.types:
        return None
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return None
    return f.parts[f.data[0]].tolist()[0]


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Read the metadata of a GGUF file; raises ``ValueError`` if it is not one."""
    import gguf

    p = Path(path)
    with p.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{p} is not a GGUF file")
    reader = gguf.GGUFReader(str(p), "r")
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            continue  # vocabularies: large and not useful here
        try:
            meta[key] = _field_value(f)
        except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as exc:
            # A value this gguf release cannot decode is left out: only a few known keys are
            # read from ``meta``, and one odd key must not make a valid model unreadable.
            log.debug("GGUF key %s of %s not decoded: %s", key, p, exc)

    arch = meta.get("general.architecture")
    ctx = meta.get(f"{arch}.context_length") if arch else None
    emb = meta.get(f"{arch}.embedding_length") if arch else None

    quant: str | None = None
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int):
        try:
            quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            quant = None
    if quant is None and reader.tensors:
        # The most common type among the large (2-D) tensors is what the file was quantized to.
        counts = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
        if counts:
            quant = counts.most_common(1)[0][0]

    template = meta.get("tokenizer.chat_template")
    return GGUFInfo(
        architecture=str(arch) if arch else None,
        context_length=int(ctx) if isinstance(ctx, int | float) else None,
        quantization=quant,
        chat_template=template if isinstance(template, str) else None,
        embedding_length=int(emb) if isinstance(emb, int | float) else None,
        name=meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        size_bytes=p.stat().st_size,
        metadata={k: v for k, v in meta.items() if isinstance(v, str | int | float | bool)},
    )


# -- sizing ------------------------------------------------------------------------------------

# Bytes per KV cache element by llama.cpp cache type (q8_0: 32 values in 34 bytes).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class GGUFShape:
    """What sizing a model needs from its GGUF header (tensors are never read)."""

    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_embd_k_gqa: int  # K elements per token per layer (head_count_kv × key_length)
    n_embd_v_gqa: int
    n_vocab: int
    n_ctx_train: int | None
    weights_bytes: int  # every tensor, as stored (llama.cpp maps or copies them as they are)

    @property
    def encoder_only(self) -> bool:
        return self.architecture in EMBEDDING_ARCHITECTURES

    def kv_bytes_per_cell(self, kv_type: str = "f16") -> int:
        """KV cache bytes one cell (one token of one sequence) takes over every layer."""
        if self.encoder_only:
            return 0  # llama.cpp gives encoders no KV cache: an input is computed whole
        return int(self.n_layer * (self.n_embd_k_gqa + self.n_embd_v_gqa) * KV_TYPE_BYTES.get(kv_type, 2.0))


def read_gguf_shape(path: str | Path) -> GGUFShape:
    """The sizing figures of a GGUF file; raises ``ValueError`` when it lacks them."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r")

    def value(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return None
        v = _field_value(f)
        if isinstance(v, list):  # per-layer values (some architectures): the largest
            v = max(v) if v else None
        return v

    arch = value("general.architecture")
    if not arch:
        raise ValueError(f"{path} has no general.architecture")
    n_layer = value(f"{arch}.block_count")
    n_embd = value(f"{arch}.embedding_length")
    if not n_layer or not n_embd:
        raise ValueError(f"{path} has no {arch}.block_count or {arch}.embedding_length")
    n_head = int(value(f"{arch}.attention.head_count") or 1)
    n_head_kv = int(value(f"{arch}.attention.head_count_kv") or n_head)
    k_len = int(value(f"{arch}.attention.key_length") or n_embd // n_head)
    v_len = int(value(f"{arch}.attention.value_length") or n_embd // n_head)
    n_vocab = value(f"{arch}.vocab_size")
    weights = 0
    for t in reader.tensors:
        weights += int(t.n_bytes)
        if n_vocab is None and t.name == "token_embd.weight":
            n_vocab = int(t.shape[-1]) if len(t.shape) > 1 else None
    if n_vocab is None and "tokenizer.ggml.tokens" in reader.fields:
        n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    ctx = value(f"{arch}.context_length")
    return GGUFShape(
        architecture=str(arch), n_layer=int(n_layer), n_embd=int(n_embd), n_head=n_head,
        n_embd_k_gqa=n_head_kv * k_len, n_embd_v_gqa=n_head_kv * v_len, n_vocab=int(n_vocab or 0),
        n_ctx_train=int(ctx) if ctx else None, weights_bytes=weights,
    )


@dataclass(frozen=True)
class Footprint:
    """The memory a loaded model holds, by part (bytes)."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int  # llama.cpp's compute and output buffers

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


def estimate_footprint(shape: GGUFShape, *, kv_cells: int, n_ubatch: int, n_seq: int,
                       flash_attn: bool = True, kv_type: str = "f16", n_ctx: int | None = None) -> Footprint:
    """What llama.cpp will allocate for a model, from its shape and the context it gets.

    - Weights: every tensor as stored.
    - KV cache: ``n_layer × kv_cells × (n_embd_k_gqa + n_embd_v_gqa)`` elements of the cache
      type (llama.cpp's own formula; none for an encoder).
    - Compute: llama.cpp reserves its graph for the worst micro-batch, whose largest live
      tensor is the logits (``n_ubatch × n_vocab`` floats) or, without flash attention, the
      attention scores (``n_ubatch × kv_cells × n_head``); the rest of a layer's activations
      add about three rows of ``n_embd`` per token. Plus the output buffer (a logits row per
      sequence). Measured against llama.cpp's reported buffers (SmolLM2-135M, a random Llama,
      MiniLM; 63 and 512-token micro-batches, flash attention on and off): within 1 %.
    - An encoder (BERT family) computes a whole input (``n_ctx`` tokens) in one micro-batch in
      a context opened on its first embedding request: that context is counted here, so the
      budget holds room for it.
    """
    f32 = 4
    if shape.encoder_only:
        rows = n_ctx or shape.n_ctx_train or n_ubatch
        # Embeddings out (one per token) and about a dozen rows of activations per token.
        compute = f32 * rows * shape.n_embd * 12
        return Footprint(shape.weights_bytes, 0, compute)
    kv = kv_cells * shape.kv_bytes_per_cell(kv_type)
    widest = max(shape.n_vocab, 0 if flash_attn else kv_cells * shape.n_head)
    compute = f32 * n_ubatch * (widest + 3 * shape.n_embd) + f32 * shape.n_vocab * n_seq
    return Footprint(shape.weights_bytes, kv, compute)
