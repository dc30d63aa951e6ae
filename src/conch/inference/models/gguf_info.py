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


# GGUF value types (gguf.GGUFValueType) -> struct format of a scalar.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 4096  # numeric arrays up to this long are read (per-layer values); longer ones skipped


def _read_header(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, list[int], int]]]:
    """A GGUF file's key/values and tensor infos (name, dims, ggml type), read directly.

    gguf's ``GGUFReader`` decodes every array into numpy objects, and a tokenizer's vocabulary
    and merges (~100k strings for SmolLM2) took it 4-5 s; sizing needs only their lengths. A
    long array's value here is its length."""
    import mmap
    import struct

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            text = bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", errors="replace")
            pos += 8 + n
            return text

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype == _STRING:
                return string()
            if vtype == _ARRAY:
                etype, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if etype == _STRING:
                    for _ in range(count):
                        (n,) = struct.unpack_from("<Q", buf, pos)
                        pos += 8 + n
                    return count
                fmt = _SCALARS.get(etype)
                if fmt is None:  # nested arrays: not in any model file sizing reads
                    raise ValueError(f"{path}: unsupported GGUF array element type {etype}")
                size = struct.calcsize("<" + fmt)
                out: Any = list(struct.unpack_from(f"<{count}{fmt}", buf, pos)) if count <= _SMALL_ARRAY else count
                pos += size * count
                return out
            fmt = _SCALARS.get(vtype)
            if fmt is None:
                raise ValueError(f"{path}: unknown GGUF value type {vtype}")
            (v,) = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return v

        kv: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            (vtype,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            kv[key] = value(vtype)
        tensors = []
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
            (ttype,) = struct.unpack_from("<I", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 4 + 8
            tensors.append((name, dims, ttype))
    return kv, tensors


def _tensor_bytes(dims: list[int], ttype: int) -> int:
    import gguf

    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
    n = 1
    for d in dims:
        n *= d
    return n // block * type_size


def read_gguf_shape(path: str | Path) -> GGUFShape:
    """The sizing figures of a GGUF file; raises ``ValueError`` when it lacks them."""
    kv, tensors = _read_header(path)

    def num(key: str) -> int | None:
        v = kv.get(key)
        if isinstance(v, list):  # per-layer values (some architectures): the largest
            v = max(v) if v else None
        return int(v) if isinstance(v, int | float) else None

    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"{path} has no general.architecture")
    n_layer = num(f"{arch}.block_count")
    n_embd = num(f"{arch}.embedding_length")
    if not n_layer or not n_embd:
        raise ValueError(f"{path} has no {arch}.block_count or {arch}.embedding_length")
    n_head = num(f"{arch}.attention.head_count") or 1
    n_head_kv = num(f"{arch}.attention.head_count_kv") or n_head
    k_len = num(f"{arch}.attention.key_length") or n_embd // n_head
    v_len = num(f"{arch}.attention.value_length") or n_embd // n_head
    n_vocab = num(f"{arch}.vocab_size")
    weights = 0
    for name, dims, ttype in tensors:
        weights += _tensor_bytes(dims, ttype)
        if n_vocab is None and name == "token_embd.weight" and len(dims) > 1:
            n_vocab = dims[1]
    if n_vocab is None:
        tokens = kv.get("tokenizer.ggml.tokens")
        n_vocab = tokens if isinstance(tokens, int) else len(tokens) if isinstance(tokens, list) else 0
    return GGUFShape(
        architecture=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_embd_k_gqa=n_head_kv * k_len, n_embd_v_gqa=n_head_kv * v_len, n_vocab=int(n_vocab or 0),
        n_ctx_train=num(f"{arch}.context_length"), weights_bytes=weights,
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
