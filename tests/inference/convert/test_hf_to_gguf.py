"""Safetensors -> GGUF conversion checked against independent references.

MiniLM: sentence-transformers' own embeddings (tests/data/minilm_reference.json, made by
scripts/make_minilm_reference.py with torch), and a live comparison when torch is installed.
Llama: a random-weight checkpoint made here, its logits from a numpy forward pass (and from
transformers when installed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conch.inference.models.convert.hf_to_gguf import DIRECT_TYPES, UnsupportedModel, convert
from tests.inference.convert.tiny_llama import CONFIG, forward, make_tiny_llama

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "minilm_reference.json"
IDS = [5, 17, 42, 100, 7, 300, 2, 9, 64, 128]


def _embed(path: Path, sentences: list[str]) -> np.ndarray:
    from llama_cpp import Llama

    model = Llama(str(path), embedding=True, verbose=False, n_ctx=512, n_threads=2)
    try:
        vecs = np.array([model.embed(s) for s in sentences], dtype=np.float64)
    finally:
        model.close()
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def _logits(path: Path, ids: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    model = Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    try:
        model.eval(ids)
        return np.array(model.scores[: len(ids)], dtype=np.float64)
    finally:
        model.close()


@pytest.fixture(scope="module")
def reference() -> dict[str, list]:
    return json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("out_type,threshold", [("f16", 0.99), ("q8_0", 0.98), ("f32", 0.99)])
def test_minilm_embeddings_match_sentence_transformers(
    minilm: Path, reference: dict[str, list], tmp_path: Path, out_type: str, threshold: float
) -> None:
    pytest.importorskip("llama_cpp")
    out = tmp_path / f"minilm-{out_type}.gguf"
    result = convert(minilm, out, out_type)
    assert result.architecture == "bert" and result.capabilities == ["embeddings"]
    assert result.metadata["pooling"] == "mean"
    got = _embed(out, reference["sentences"])
    ref = np.array(reference["embeddings"])
    assert got.shape == ref.shape == (50, 384)
    cos = (got * ref).sum(axis=1)
    assert cos.min() >= threshold, f"min cosine {cos.min():.4f} for {out_type}"


def test_minilm_live_comparison_with_torch(minilm: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    sentences = ["conch converts models", "a tiny shell language", "embeddings for search"]
    ref = st.SentenceTransformer(str(minilm), device="cpu").encode(sentences, normalize_embeddings=True)
    out = tmp_path / "minilm.gguf"
    convert(minilm, out, "f16")
    cos = (_embed(out, sentences) * ref).sum(axis=1)
    assert cos.min() >= 0.99


def test_minilm_gguf_metadata(minilm: Path, tmp_path: Path) -> None:
    import gguf

    out = tmp_path / "m.gguf"
    convert(minilm, out, "f16", name="all-MiniLM-L6-v2")
    reader = gguf.GGUFReader(str(out))
    fields = {k: f.contents() for k, f in reader.fields.items() if k != "tokenizer.ggml.tokens"}
    assert fields["general.architecture"] == "bert"
    assert fields["bert.context_length"] == 512
    assert fields["bert.attention.causal"] is False
    assert fields["bert.pooling_type"] == 1
    assert fields["tokenizer.ggml.model"] == "bert"
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "position_embd.weight", "token_types.weight",
            "blk.5.ffn_down.weight", "blk.0.attn_q.bias"} <= names


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama_f32_logits_match_reference(tmp_path: Path, dtype: str) -> None:
    pytest.importorskip("llama_cpp")
    src = tmp_path / "src"
    weights = make_tiny_llama(src, seed=1, dtype=dtype)
    out = tmp_path / "tiny.gguf"
    result = convert(src, out, "f32")
    assert result.architecture == "llama" and result.metadata["chat_template"]
    got = _logits(out, IDS)
    ref = forward(weights, IDS)
    assert np.abs(got - ref).max() < 1e-2 * max(1.0, np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_numpy_reference_agrees_with_transformers(tiny_llama: tuple[Path, dict]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    src, weights = tiny_llama
    model = transformers.LlamaForCausalLM.from_pretrained(str(src))
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([IDS])).logits[0].double().numpy()
    assert np.abs(hf - forward(weights, IDS)).max() < 1e-3


@pytest.mark.parametrize("out_type", DIRECT_TYPES)
def test_llama_direct_types_load_and_track_reference(
    tiny_llama: tuple[Path, dict], tmp_path: Path, out_type: str
) -> None:
    pytest.importorskip("llama_cpp")
    src, weights = tiny_llama
    out = tmp_path / f"tiny-{out_type}.gguf"
    convert(src, out, out_type)
    got = _logits(out, IDS)
    ref = forward(weights, IDS)
    corr = np.corrcoef(got.ravel(), ref.ravel())[0, 1]
    # Random gaussian weights are the hardest case for 4-bit blocks; real weights fare better.
    floor = {"q4_0": 0.9, "q4_1": 0.9, "q5_0": 0.97, "q5_1": 0.97}.get(out_type, 0.999)
    assert corr > floor, corr


def test_llama_tokenizer_and_chat_template_carried_over(tiny_llama: tuple[Path, dict], tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    src, _ = tiny_llama
    out = tmp_path / "tiny.gguf"
    convert(src, out, "f16")
    model = llama_cpp.Llama(str(out), n_ctx=64, verbose=False)
    try:
        text = "the quick brown fox, hello world"
        hf = Tokenizer.from_file(str(src / "tokenizer.json")).encode(text).ids
        assert model.tokenize(text.encode(), add_bos=False) == hf
        assert "<|im_start|>" in model.metadata.get("tokenizer.chat_template", "")
    finally:
        model.close()


def test_unsupported_architecture_and_type(tmp_path: Path, tiny_llama: tuple[Path, dict]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModel) as info:
        convert(tmp_path, tmp_path / "x.gguf", "f16")
    assert "LlamaForCausalLM" in str(info.value) and "BertModel" in str(info.value)
    src, _ = tiny_llama
    with pytest.raises(UnsupportedModel) as info:
        convert(src, tmp_path / "y.gguf", "q4_k_m")
    assert "f16" in str(info.value)
    assert CONFIG["vocab_size"] == 512


def test_sentencepiece_style_vocab_tokenizes_like_the_original(tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    from tests.inference.convert.tiny_llama import make_spm_tokenizer, make_weights

    src = tmp_path / "spm"
    src.mkdir()
    make_spm_tokenizer(src, CONFIG["vocab_size"])
    (src / "config.json").write_text(json.dumps(CONFIG))
    save_file(make_weights(CONFIG), str(src / "model.safetensors"))
    out = tmp_path / "spm.gguf"
    result = convert(src, out, "f16")
    assert result.metadata["tokenizer"] == "llama"
    hf = Tokenizer.from_file(str(src / "tokenizer.json"))
    model = llama_cpp.Llama(str(out), n_ctx=64, verbose=False)
    try:
        for text in ("the quick brown fox", "hello world, conch!", "models are quantized 123"):
            assert model.tokenize(text.encode(), add_bos=False) == hf.encode(text).ids
    finally:
        model.close()
