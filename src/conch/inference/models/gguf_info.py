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
