"""A tiny random-weight CLIP projector (``mmproj``) GGUF that llama.cpp's libmtmd loads.

The smallest projector clip.cpp supports is LLaVA's (``clip.projector_type = "mlp"``): a ViT
(patch embedding, position embedding, pre-norm blocks of attention and a GELU MLP) whose
patch features go through two linear layers into the text model's embedding space. This file
writes exactly the metadata and tensors clip.cpp reads for it, with Gaussian noise for
weights, as llama.cpp's own tests build tiny random models: the image tokens it gives mean
nothing, but they are evaluated by the text model as a real projector's are, which is what
the plumbing needs. ``image_size / patch_size`` squared is the image's token count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_random_mmproj(
    out: Path,
    *,
    text_embd: int,
    image_size: int = 32,
    patch_size: int = 8,
    hidden: int = 32,
    heads: int = 2,
    ffn: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write the projector to ``out``; ``text_embd`` must be the text model's embedding length."""
    import gguf

    w = gguf.GGUFWriter(str(out), "clip")
    w.add_name("random-mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", hidden)
    w.add_uint32("clip.vision.feed_forward_length", ffn)
    w.add_uint32("clip.vision.projection_dim", text_embd)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.block_count", layers)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(seed)
    n_patches = (image_size // patch_size) ** 2

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32))

    def const(name: str, value: float, n: int) -> None:
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    # numpy shapes are ggml's dimensions reversed: a conv kernel [out, in, kh, kw], a matrix [out, in].
    rand("v.patch_embd.weight", hidden, 3, patch_size, patch_size)
    const("v.patch_embd.bias", 0.0, hidden)
    rand("v.class_embd", hidden)
    rand("v.position_embd.weight", n_patches + 1, hidden)
    const("v.pre_ln.weight", 1.0, hidden)
    const("v.pre_ln.bias", 0.0, hidden)
    for i in range(layers):
        p = f"v.blk.{i}"
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            rand(f"{p}.{t}.weight", hidden, hidden)
            const(f"{p}.{t}.bias", 0.0, hidden)
        const(f"{p}.ln1.weight", 1.0, hidden)
        const(f"{p}.ln1.bias", 0.0, hidden)
        const(f"{p}.ln2.weight", 1.0, hidden)
        const(f"{p}.ln2.bias", 0.0, hidden)
        rand(f"{p}.ffn_up.weight", ffn, hidden)
        const(f"{p}.ffn_up.bias", 0.0, ffn)
        rand(f"{p}.ffn_down.weight", hidden, ffn)
        const(f"{p}.ffn_down.bias", 0.0, hidden)
    rand("mm.0.weight", text_embd, hidden)
    const("mm.0.bias", 0.0, text_embd)
    rand("mm.2.weight", text_embd, text_embd)
    const("mm.2.bias", 0.0, text_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def png_bytes(width: int = 24, height: int = 24, *, seed: int = 0) -> bytes:
    """A small random RGB PNG (stdlib only), to send as an image."""
    import struct
    import zlib

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
