"""safetensors -> ONNX export (optional `onnx` extra) and the onnxruntime embedding engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conch.inference.models.convert import onnx_export

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "minilm_reference.json"

pytestmark = pytest.mark.skipif(
    bool(onnx_export.missing_dependencies()),
    reason=f"the onnx extra is not installed (missing: {', '.join(onnx_export.missing_dependencies())})",
)


@pytest.fixture(scope="module")
def exported(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx")
    onnx_export.export(minilm, out)
    return out


def test_export_matches_torch_within_1e_3(minilm: Path, exported: Path) -> None:
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.enable_padding()
    encs = tok.encode_batch(["conch converts models", "a longer sentence with a few more words in it"])
    ids = np.array([e.ids for e in encs], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
    types = np.zeros_like(ids)
    sess = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    model = AutoModel.from_pretrained(str(minilm)).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
    assert np.abs(got - ref).max() < 1e-3


def test_onnx_engine_embeddings_match_sentence_transformers(exported: Path) -> None:
    from conch.inference.engines.onnx import OnnxEmbeddingEngine

    ref = json.loads(REFERENCE.read_text())
    engine = OnnxEmbeddingEngine(exported)
    vecs, n_tokens = engine.embed_texts(ref["sentences"])
    got = np.array(vecs)
    want = np.array(ref["embeddings"])
    assert n_tokens > len(ref["sentences"])
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the Normalize module
    assert np.abs(got - want).max() < 1e-3
