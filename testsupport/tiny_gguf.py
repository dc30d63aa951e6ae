"""A small random-weight Llama GGUF that llama.cpp loads and chats with (nonsense, quickly).

Its tokenizer and chat template are the bundled SmolLM2's (copied key by key from that GGUF),
so prompts render and tokenize as for a real chat model; the weights are Gaussian noise in
F16 with RMS norms of ones, as llama.cpp's own tests build their tiny models. Tests that need
a third model with a footprint of its own (the memory budget's) make one here; so does the
GPU benchmark (benchmarks/gpu.py: SmolLM2-1.7B's shape, quantized after).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_random_llama(
    out: Path,
    vocab_gguf: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 256,
    ctx: int = 4096,
    seed: int = 0,
    name: str = "random-llama",
    rope_base: float = 10000.0,
    std: float = 0.02,
) -> Path:
    import gguf

    vocab = gguf.GGUFReader(str(vocab_gguf))
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(name)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, f in vocab.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    rng = np.random.default_rng(seed)

    def mat(tensor: str, rows: int, cols: int) -> None:
        w.add_tensor(tensor, (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16))

    def norm(tensor: str) -> None:
        w.add_tensor(tensor, np.ones(hidden, dtype=np.float32))

    mat("token_embd.weight", n_vocab, hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        mat(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        mat(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        mat(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        mat(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        mat(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        mat(f"blk.{i}.ffn_up.weight", ffn, hidden)
        mat(f"blk.{i}.ffn_down.weight", hidden, ffn)
    norm("output_norm.weight")
    mat("output.weight", n_vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
