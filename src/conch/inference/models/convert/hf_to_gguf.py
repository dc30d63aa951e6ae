"""Hugging Face safetensors checkpoints -> GGUF, written with the ``gguf`` package.

Supported: ``LlamaForCausalLM`` (and ``MistralForCausalLM``, same layout) and ``BertModel``.
Tensor names go through ``gguf``'s TensorNameMap; hyperparameters, the tokenizer and the chat
template go into the metadata the way llama.cpp reads them.

The file is written in one streaming pass: every tensor's final type and byte size is known
from the safetensors header, so the GGUF header and tensor table are written first and each
tensor is then loaded (memory-mapped), converted and appended on its own. Memory stays at
about one tensor, whatever the model's size.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conch.inference.models.convert.safetensors_io import TensorLoader, TensorRef, index_dir
from conch.inference.models.files import ProgressCallback

log = logging.getLogger(__name__)

# HF architecture name -> gguf architecture key
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
}

# Output types the gguf package can write directly (everything else goes through llama.cpp).
DIRECT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


class UnsupportedModel(ValueError):
    """The checkpoint's architecture or files are not something this converter handles."""


@dataclass
class ConvertedModel:
    path: Path
    architecture: str
    context_length: int | None
    quantization: str
    capabilities: list[str]
    tensor_count: int
    metadata: dict[str, Any] = field(default_factory=dict)


# The pre-tokenizer of a BPE vocabulary is named by hashing how it splits a probe text; these
# are the families conch recognises by hash. Others are named from the tokenizer's structure.
_PROBE_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
_KNOWN_PRE = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "bert-bge",
}


def _gguf() -> Any:
    import gguf

    # The gguf package logs every key it writes at INFO; conch reports progress itself.
    logging.getLogger("gguf").setLevel(logging.ERROR)
    return gguf


def qtype_for(out_type: str) -> Any:
    gguf = _gguf()
    t = out_type.lower()
    if t not in DIRECT_TYPES:
        raise UnsupportedModel(
            f"output type {out_type!r} is not written directly; direct types: {', '.join(DIRECT_TYPES)}"
        )
    return getattr(gguf.GGMLQuantizationType, t.upper())


def file_type_for(out_type: str) -> Any:
    gguf = _gguf()
    t = out_type.lower()
    if t == "f32":
        return gguf.LlamaFileType.ALL_F32
    return getattr(gguf.LlamaFileType, f"MOSTLY_{t.upper()}")


def read_config(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise UnsupportedModel(f"{model_dir} has no config.json (not a Hugging Face checkpoint)")
    config: dict[str, Any] = json.loads(cfg_path.read_text())
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    return config


def architecture_of(config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    for a in archs:
        if a in SUPPORTED_ARCHITECTURES:
            return str(a)
    if not archs and config.get("model_type") == "bert":
        return "BertModel"
    raise UnsupportedModel(
        f"architecture {', '.join(archs) or config.get('model_type') or 'unknown'} is not supported; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


# -- tokenizers ------------------------------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _looks_special(token: str) -> bool:
    return (token.startswith("<|") and token.endswith("|>")) or token in ("<pad>", "<mask>")


def detect_pre_tokenizer(model_dir: Path, tok_json: dict[str, Any]) -> str:
    """Name the BPE pre-tokenizer: by the probe-text hash, else from the tokenizer's structure."""
    from tokenizers import Tokenizer

    try:
        tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as exc:
        # tokenizers raises a bare Exception for a file it cannot load (a newer format, say);
        # the tokenizer's structure below still names the pre-tokenizer, so go on without it.
        log.debug("tokenizer.json not loadable by tokenizers (%s); reading its structure", exc)
    else:
        ids = tk.encode(_PROBE_TEXT, add_special_tokens=True).ids
        known = _KNOWN_PRE.get(hashlib.sha256(str(ids).encode()).hexdigest())
        if known:
            return known
    pre = tok_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    for p in parts:
        if not isinstance(p, dict):
            continue
        if p.get("type") == "Split":
            regex = str((p.get("pattern") or {}).get("Regex", ""))
            if "\\p{N}{1,3}" in regex:
                return "llama-bpe"
            if "\\p{N}" in regex and "?[^\\s\\p{L}\\p{N}]+" in regex:
                return "gpt-2"
        if p.get("type") == "Digits" and p.get("individual_digits"):
            return "smollm"
        if p.get("type") == "ByteLevel" and p.get("use_regex", True):
            return "gpt-2"
    return "default"


@dataclass
class Vocab:
    model: str  # gguf tokenizer model: gpt2 | llama | bert
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    pre: str | None = None


def _pad_vocab(tokens: list[str | None], types: list[int], vocab_size: int) -> tuple[list[str], list[int]]:
    gguf = _gguf()
    out_tokens: list[str] = []
    out_types: list[int] = []
    for i in range(max(vocab_size, len(tokens))):
        tok = tokens[i] if i < len(tokens) else None
        if tok is None:
            out_tokens.append(f"[PAD{i}]")
            out_types.append(int(gguf.TokenType.UNUSED))
        else:
            out_tokens.append(tok)
            out_types.append(types[i])
    return out_tokens, out_types


def bert_vocab(model_dir: Path, vocab_size: int) -> Vocab:
    """WordPiece, rewritten the way llama.cpp's tokenizer expects: a word start carries a
    leading U+2581 and a continuation piece loses its ``##``."""
    gguf = _gguf()
    tok_json = _load_json(model_dir / "tokenizer.json")
    vocab: dict[str, int] = {}
    model = tok_json.get("model") or {}
    if isinstance(model.get("vocab"), dict):
        vocab = {str(k): int(v) for k, v in model["vocab"].items()}
    elif (model_dir / "vocab.txt").is_file():
        lines = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
        vocab = {line: i for i, line in enumerate(lines)}
    else:
        raise UnsupportedModel("BERT checkpoint has neither tokenizer.json nor vocab.txt")
    special = {t["content"] for t in tok_json.get("added_tokens", []) if t.get("special")}
    cfg = _load_json(model_dir / "tokenizer_config.json")
    for key in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        if isinstance(cfg.get(key), str):
            special.add(cfg[key])
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens: list[str | None] = [None] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    for tok, i in vocab.items():
        if tok in special:
            tokens[i] = tok
            types[i] = int(gguf.TokenType.CONTROL)
        elif tok.startswith("##"):
            tokens[i] = tok[2:]
        else:
            tokens[i] = "\u2581" + tok
    out_tokens, out_types = _pad_vocab(tokens, types, size)
    pre = detect_pre_tokenizer(model_dir, tok_json) if tok_json else "default"
    return Vocab("bert", out_tokens, out_types, None, pre if pre == "bert-bge" else "default")


def _sentencepiece_vocab(model_dir: Path, vocab_size: int) -> Vocab | None:
    path = model_dir / "tokenizer.model"
    if not path.is_file():
        return None
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:
        return None
    gguf = _gguf()
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(path))
    n = sp.vocab_size()
    tokens: list[str | None] = []
    types: list[int] = []
    scores: list[float] = []
    for i in range(n):
        tokens.append(sp.IdToPiece(i))
        scores.append(float(sp.GetScore(i)))
        if sp.IsUnknown(i):
            types.append(int(gguf.TokenType.UNKNOWN))
        elif sp.IsControl(i):
            types.append(int(gguf.TokenType.CONTROL))
        elif sp.IsUnused(i):
            types.append(int(gguf.TokenType.UNUSED))
        elif sp.IsByte(i):
            types.append(int(gguf.TokenType.BYTE))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    added = _load_json(model_dir / "added_tokens.json")
    for tok, i in sorted(added.items(), key=lambda kv: kv[1]):
        while len(tokens) <= i:
            tokens.append(None)
            types.append(int(gguf.TokenType.UNUSED))
            scores.append(-1000.0)
        tokens[i] = tok
        types[i] = int(gguf.TokenType.USER_DEFINED)
    out_tokens, out_types = _pad_vocab(tokens, types, vocab_size)
    scores += [-1000.0] * (len(out_tokens) - len(scores))
    return Vocab("llama", out_tokens, out_types, scores, "default")


def llama_vocab(model_dir: Path, vocab_size: int) -> Vocab:
    gguf = _gguf()
    sp = _sentencepiece_vocab(model_dir, vocab_size)
    if sp is not None:
        return sp
    tok_json = _load_json(model_dir / "tokenizer.json")
    model = tok_json.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise UnsupportedModel(
            "the Llama tokenizer must be a BPE tokenizer.json or a SentencePiece tokenizer.model"
        )
    vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
    added = {t["content"]: t for t in tok_json.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = int(t["id"])
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens: list[str | None] = [None] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    byte_fallback = bool(model.get("byte_fallback"))
    unk = model.get("unk_token")
    scores: list[float] = [0.0] * size
    for tok, i in vocab.items():
        tokens[i] = tok
        scores[i] = -float(i)
        meta = added.get(tok)
        if meta is not None:
            if meta.get("special") or _looks_special(tok):
                types[i] = int(gguf.TokenType.CONTROL)
            else:
                types[i] = int(gguf.TokenType.USER_DEFINED)
            scores[i] = 0.0
        elif byte_fallback and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            types[i] = int(gguf.TokenType.BYTE)
        elif tok == unk:
            types[i] = int(gguf.TokenType.UNKNOWN)
    out_tokens, out_types = _pad_vocab(tokens, types, size)
    if byte_fallback:
        # A SentencePiece model exported as tokenizer.json: pieces with U+2581 and byte tokens.
        scores += [-1000.0] * (len(out_tokens) - len(scores))
        return Vocab("llama", out_tokens, out_types, scores, "default")
    return Vocab("gpt2", out_tokens, out_types, None, detect_pre_tokenizer(model_dir, tok_json))


# -- tensors --------------------------------------------------------------------------------


def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder the rows of a q/k projection from HF's rotate-half layout to llama.cpp's
    interleaved-pairs layout: within each head, row pairs (i, i + d/2) become neighbours."""
    rows = w.shape[0]
    return (
        w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@dataclass
class _Planned:
    name: str  # gguf name
    ref: TensorRef
    shape: tuple[int, ...]
    qtype: Any  # GGMLQuantizationType
    transform: Callable[[np.ndarray], np.ndarray] | None = None


def _choose_qtype(gguf_name: str, shape: tuple[int, ...], want: Any) -> Any:
    gguf = _gguf()
    q = gguf.GGMLQuantizationType
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return q.F32
    # Small lookup tables that llama.cpp reads as F32 whatever the file type.
    if gguf_name in ("position_embd.weight", "token_types.weight"):
        return q.F32
    if want in (q.F32, q.F16, q.BF16):
        return want
    block, _ = gguf.GGML_QUANT_SIZES[want]
    if shape[-1] % block != 0:
        return q.F16
    return want


def _nbytes(shape: tuple[int, ...], qtype: Any) -> int:
    gguf = _gguf()
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) if shape else 1
    return n // block * size


def _encode(data: np.ndarray, qtype: Any) -> np.ndarray:
    gguf = _gguf()
    q = gguf.GGMLQuantizationType
    if qtype == q.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == q.F16:
        return np.ascontiguousarray(data, dtype=np.float16)
    if qtype == q.BF16:
        bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
        # Round to nearest even, as the reference bf16 conversion does.
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
        return rounded.view(np.uint8).reshape(*data.shape[:-1], data.shape[-1] * 2)
    out: np.ndarray = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
    return out


def _plan_llama(config: dict[str, Any], tensors: dict[str, TensorRef], want: Any) -> list[_Planned]:
    gguf = _gguf()
    n_layers = int(config["num_hidden_layers"])
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    plan: list[_Planned] = []
    for name, ref in tensors.items():
        if name.endswith(".rotary_emb.inv_freq"):
            continue
        hf_name = name.removeprefix("text_model.")
        new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise UnsupportedModel(f"cannot map tensor {name!r} to a llama GGUF tensor")
        transform: Callable[[np.ndarray], np.ndarray] | None = None
        if hf_name.endswith("q_proj.weight"):
            transform = lambda w, h=n_head: _permute_rope(w, h)  # noqa: E731
        elif hf_name.endswith("k_proj.weight"):
            transform = lambda w, h=n_kv: _permute_rope(w, h)  # noqa: E731
        plan.append(_Planned(new, ref, ref.shape, _choose_qtype(new, ref.shape, want), transform))
    names = {p.name for p in plan}
    if "output.weight" in names and config.get("tie_word_embeddings"):
        # Tied: llama.cpp reuses token_embd when output is absent, so the copy is dropped.
        plan = [p for p in plan if p.name != "output.weight"]
    return plan


def _plan_bert(config: dict[str, Any], tensors: dict[str, TensorRef], want: Any) -> list[_Planned]:
    gguf = _gguf()
    n_layers = int(config["num_hidden_layers"])
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    plan: list[_Planned] = []
    for name, ref in tensors.items():
        hf_name = name.removeprefix("bert.")
        if hf_name.endswith(".gamma"):
            hf_name = hf_name[: -len(".gamma")] + ".weight"
        elif hf_name.endswith(".beta"):
            hf_name = hf_name[: -len(".beta")] + ".bias"
        # Embeddings only: the pooler and the masked-LM heads are not part of the encoder.
        if hf_name == "embeddings.position_ids" or hf_name.startswith(("pooler.", "cls.")):
            continue
        new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise UnsupportedModel(f"cannot map tensor {name!r} to a bert GGUF tensor")
        plan.append(_Planned(new, ref, ref.shape, _choose_qtype(new, ref.shape, want)))
    return plan


def _pooling_type(model_dir: Path) -> Any | None:
    gguf = _gguf()
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    for mod in json.loads(modules.read_text()):
        if str(mod.get("type", "")).endswith("Pooling"):
            cfg = _load_json(model_dir / mod.get("path", "") / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            if cfg.get("pooling_mode_lasttoken"):
                return gguf.PoolingType.LAST
            mode = cfg.get("pooling_mode")
            mapping = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS,
                       "lasttoken": gguf.PoolingType.LAST}
            if mode in mapping:
                return mapping[mode]
            raise UnsupportedModel("only mean, cls and last-token pooling are supported")
    return None


def _context_length(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_ctx", "n_positions", "max_sequence_length"):
        if config.get(key):
            return int(config[key])
    return None


def _write_metadata(writer: Any, arch: str, config: dict[str, Any], model_dir: Path,
                    out_type: str, name: str) -> dict[str, Any]:
    gguf = _gguf()
    meta: dict[str, Any] = {}
    writer.add_name(name)
    writer.add_type("model")
    writer.add_file_type(file_type_for(out_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_ctx = _context_length(config)
    writer.add_block_count(int(config["num_hidden_layers"]))
    if n_ctx:
        writer.add_context_length(n_ctx)
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    vocab_size = int(config.get("vocab_size") or 0)

    if arch == "llama":
        n_head = int(config["num_attention_heads"])
        writer.add_head_count_kv(int(config.get("num_key_value_heads") or n_head))
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
        rope = config.get("rope_parameters") or {}
        theta = config.get("rope_theta", rope.get("rope_theta"))
        if theta is not None:
            writer.add_rope_freq_base(float(theta))
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // n_head)
        writer.add_rope_dimension_count(head_dim)
        if config.get("head_dim"):
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        scaling = config.get("rope_scaling") or {}
        if scaling.get("rope_type", scaling.get("type")) == "linear" and scaling.get("factor"):
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(scaling["factor"]))
        vocab = llama_vocab(model_dir, vocab_size)
        writer.add_vocab_size(len(vocab.tokens))
    else:
        writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
        writer.add_causal_attention(False)
        pooling = _pooling_type(model_dir)
        if pooling is not None:
            writer.add_pooling_type(pooling)
            meta["pooling"] = pooling.name.lower()
        writer.add_token_type_count(int(config.get("type_vocab_size", 1)))
        vocab = bert_vocab(model_dir, vocab_size)

    writer.add_tokenizer_model(vocab.model)
    if vocab.pre:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    special = gguf.SpecialVocab(model_dir, load_merges=vocab.model == "gpt2", n_vocab=len(vocab.tokens))
    special.add_to_gguf(writer, quiet=True)
    meta["tokenizer"] = vocab.model
    meta["chat_template"] = bool(special.chat_template)
    return meta


def convert(
    model_dir: str | Path,
    out_path: str | Path,
    out_type: str = "f16",
    *,
    name: str | None = None,
    progress: ProgressCallback | None = None,
) -> ConvertedModel:
    """Convert the checkpoint in ``model_dir`` into the GGUF file ``out_path``."""
    gguf = _gguf()
    model_dir = Path(model_dir)
    out_path = Path(out_path)
    config = read_config(model_dir)
    hf_arch = architecture_of(config)
    arch = SUPPORTED_ARCHITECTURES[hf_arch]
    want = qtype_for(out_type)
    try:
        tensors = index_dir(model_dir)
    except FileNotFoundError as exc:
        raise UnsupportedModel(str(exc))
    planner = _plan_llama if arch == "llama" else _plan_bert
    plan = planner(config, tensors, want)

    writer = gguf.GGUFWriter(out_path, arch)
    meta = _write_metadata(writer, arch, config, model_dir, out_type, name or model_dir.name)
    for p in plan:
        shape = p.shape
        if p.qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.dtype(np.float32 if p.qtype == gguf.GGMLQuantizationType.F32 else np.float16)
            writer.add_tensor_info(p.name, shape, dtype, _nbytes(shape, p.qtype))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, p.qtype)
            writer.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), _nbytes(shape, p.qtype),
                                   raw_dtype=p.qtype)

    total = sum(p.ref.nbytes for p in plan)
    done = 0
    loader = TensorLoader()
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        if progress is not None:
            progress({"status": "converting", "completed": 0, "total": total})
        for p in plan:
            data = loader.float32(p.ref)
            if p.transform is not None:
                data = p.transform(data)
            writer.write_tensor_data(_encode(data, p.qtype))
            done += p.ref.nbytes
            if progress is not None:
                progress({"status": "converting", "completed": done, "total": total})
    finally:
        writer.close()
        loader.close()
    capabilities = ["embeddings"] if arch == "bert" else ["chat", "embeddings"]
    return ConvertedModel(
        path=out_path,
        architecture=arch,
        context_length=_context_length(config),
        quantization=out_type.lower(),
        capabilities=capabilities,
        tensor_count=len(plan),
        metadata={"hf_architecture": hf_arch, **meta},
    )
