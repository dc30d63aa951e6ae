"""A tiny random-weight Llama checkpoint (safetensors + BPE tokenizer) and a numpy forward pass.

The forward pass follows the Hugging Face Llama definition (rotate-half RoPE, grouped-query
attention, SwiGLU, RMSNorm) written out independently of conch's converter, so it can serve
as the reference the converted GGUF is checked against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny language model for conch",
    "pipelines map and filter tables of records",
    "models are downloaded, converted and quantized",
    "one two three four five six seven eight nine ten",
] * 20


def make_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tk.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    tk.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "GPT2Tokenizer",
    }))


def make_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = config["hidden_size"]
    ff = config["intermediate_size"]
    nh = config["num_attention_heads"]
    nkv = config["num_key_value_heads"]
    hd = d // nh
    v = config["vocab_size"]

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {
        "model.embed_tokens.weight": w(v, d, scale=1.0),
        "model.norm.weight": (1 + w(d, scale=0.1)),
        "lm_head.weight": w(v, d),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = 1 + w(d, scale=0.1)
        out[f"{p}.post_attention_layernorm.weight"] = 1 + w(d, scale=0.1)
        out[f"{p}.self_attn.q_proj.weight"] = w(nh * hd, d)
        out[f"{p}.self_attn.k_proj.weight"] = w(nkv * hd, d)
        out[f"{p}.self_attn.v_proj.weight"] = w(nkv * hd, d)
        out[f"{p}.self_attn.o_proj.weight"] = w(d, nh * hd)
        out[f"{p}.mlp.gate_proj.weight"] = w(ff, d)
        out[f"{p}.mlp.up_proj.weight"] = w(ff, d)
        out[f"{p}.mlp.down_proj.weight"] = w(d, ff)
    return out


def make_tiny_llama(out_dir: Path, seed: int = 0, dtype: str = "float32") -> dict[str, np.ndarray]:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG)
    weights = make_weights(config, seed)
    if dtype == "bfloat16":
        # Store bf16 bit patterns (truncated) and keep the exactly representable f32 values.
        stored = {}
        for k, a in weights.items():
            bits = (a.view(np.uint32) >> 16).astype(np.uint16)
            weights[k] = (bits.astype(np.uint32) << 16).view(np.float32)
            stored[k] = bits
        _save_bf16(stored, out_dir / "model.safetensors")
        config["torch_dtype"] = "bfloat16"
    else:
        save_file(weights, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    make_tokenizer(out_dir, config["vocab_size"])
    return weights


def _save_bf16(tensors: dict[str, np.ndarray], path: Path) -> None:
    header: dict[str, Any] = {}
    offset = 0
    blobs = []
    for name, a in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    # x: (heads, seq, head_dim), HF rotate-half convention
    _, seq, hd = x.shape
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = np.outer(np.arange(seq), inv)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos + rot * sin


def forward(weights: dict[str, np.ndarray], ids: list[int], config: dict[str, Any] | None = None) -> np.ndarray:
    """Logits (seq, vocab) for token ids, in float64."""
    c = config or CONFIG
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    d = c["hidden_size"]
    hd = d // nh
    eps = c["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][ids]
    seq = len(ids)
    mask = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = _rms(x, W[f"{p}.input_layernorm.weight"], eps)
        q = (h @ W[f"{p}.self_attn.q_proj.weight"].T).reshape(seq, nh, hd).transpose(1, 0, 2)
        k = (h @ W[f"{p}.self_attn.k_proj.weight"].T).reshape(seq, nkv, hd).transpose(1, 0, 2)
        v = (h @ W[f"{p}.self_attn.v_proj.weight"].T).reshape(seq, nkv, hd).transpose(1, 0, 2)
        q, k = _rope(q, c["rope_theta"]), _rope(k, c["rope_theta"])
        rep = nh // nkv
        k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = (att @ v).transpose(1, 0, 2).reshape(seq, nh * hd)
        x = x + o @ W[f"{p}.self_attn.o_proj.weight"].T
        h = _rms(x, W[f"{p}.post_attention_layernorm.weight"], eps)
        g = h @ W[f"{p}.mlp.gate_proj.weight"].T
        u = h @ W[f"{p}.mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[f"{p}.mlp.down_proj.weight"].T
    x = _rms(x, W["model.norm.weight"], eps)
    logits: np.ndarray = x @ W["lm_head.weight"].T
    return logits


def make_spm_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """A SentencePiece-style BPE (U+2581 word marks, byte fallback), as Llama 2 and Mistral use."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tk.normalizer = normalizers.Sequence(  # type: ignore[assignment]
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tk.decoder = decoders.Sequence(  # type: ignore[assignment]
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)]],
        show_progress=False,
    )
    tk.train_from_iterator([c.replace(" ", "\u2581") for c in CORPUS], trainer)
    tk.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    ))
