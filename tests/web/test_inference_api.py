"""Embeddings, models, providers, storage, health, status, metrics and docs of the real server."""

from __future__ import annotations

import base64
import math
import struct
import time
import urllib.parse

import openai
import pytest

from conch.inference.models.bundled import BUNDLED_ID
from conch.inference.models.store import ModelStore
from tests.web.conftest import RunningServer
from tests.web.openai_shapes import (
    EMBEDDING_RESPONSE,
    MODEL,
    MODEL_DELETED,
    MODEL_LIST,
    check,
    check_error,
)

M = BUNDLED_ID


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


# -- embeddings ------------------------------------------------------------------------------
def test_embeddings_with_the_openai_client(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    out = client.embeddings.create(model=M, input=["the cat sat", "a dog ran", "the cat sat"])
    body = out.model_dump()
    check(body, EMBEDDING_RESPONSE)
    assert out.model == M and len(out.data) == 3
    assert [d.index for d in out.data] == [0, 1, 2]
    vecs = [d.embedding for d in out.data]
    assert all(abs(_norm(v) - 1) < 1e-4 for v in vecs)
    assert len(vecs[0]) == 576
    assert max(abs(a - b) for a, b in zip(vecs[0], vecs[2], strict=True)) < 1e-4
    assert out.usage.prompt_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens


def test_embedding_of_one_string_tokens_and_base64(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        plain = c.post("/v1/embeddings", json={"model": M, "input": "hello world"}).json()
        check(plain, EMBEDDING_RESPONSE)
        vec = plain["data"][0]["embedding"]
        b64 = c.post("/v1/embeddings", json={"model": M, "input": "hello world", "encoding_format": "base64"}).json()
        raw = base64.b64decode(b64["data"][0]["embedding"])
        decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert max(abs(a - b) for a, b in zip(vec, decoded, strict=True)) < 1e-5
        short = c.post("/v1/embeddings", json={"model": M, "input": "hello world", "dimensions": 64}).json()
        assert len(short["data"][0]["embedding"]) == 64
        assert abs(_norm(short["data"][0]["embedding"]) - 1) < 1e-4
        toks = c.post("/v1/embeddings", json={"model": M, "input": [[1, 2, 3], [4, 5]]}).json()
        assert len(toks["data"]) == 2 and toks["usage"]["prompt_tokens"] == 5
        one = c.post("/v1/embeddings", json={"model": M, "input": [10, 11, 12]}).json()
        assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] == 3


def test_embedding_errors(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        check_error(c.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "model_not_found")
        check_error(c.post("/v1/embeddings", json={"model": M, "input": []}), 400, param="input")
        check_error(c.post("/v1/embeddings", json={"model": M, "input": ""}), 400, param="input")
        check_error(c.post("/v1/embeddings", json={"model": M, "input": "x", "dimensions": 100000}), 400, param="dimensions")
        check_error(c.post("/v1/embeddings", json={"model": M, "input": "x", "encoding_format": "hex"}), 400, param="encoding_format")
        check_error(c.post("/v1/embeddings", json={"model": M, "input": [[10**9]]}), 400, param="input")


# -- models ----------------------------------------------------------------------------------
def test_models_list_and_retrieve(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert M in ids
    with inference_server.client() as c:
        body = c.get("/v1/models").json()
        check(body, MODEL_LIST)
        assert all(m["owned_by"] == "local" for m in body["data"])
        d = c.get(f"/v1/models/{M}").json()
    check(d, MODEL)
    assert d["id"] == M and d["object"] == "model" and d["owned_by"] == "local"
    assert d["format"] == "gguf" and d["status"] == "ready"
    assert d["architecture"] == "llama" and d["context_length"] == 8192 and d["quantization"] == "Q4_1"
    assert len(d["sha256"]) == 64 and d["size_bytes"] > 50_000_000
    assert "chat" in d["capabilities"]
    m = client.models.retrieve(M)
    assert m.id == M and m.owned_by == "local"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("not-a-model")


def test_model_ids_with_slashes_and_delete(inference_server: RunningServer) -> None:
    store = ModelStore(inference_server.settings)
    bundled = store.get(M)
    assert bundled is not None
    mid = "HuggingFaceTB/SmolLM2-135M-Instruct"
    store.register(bundled.model_copy(update={"id": mid}))
    with inference_server.client() as c:
        assert c.get(f"/v1/models/{mid}").json()["id"] == mid
        assert c.get("/v1/models/" + urllib.parse.quote(mid, safe="")).json()["id"] == mid
        # usable for chat under its own id
        r = c.post("/v1/chat/completions", json={"model": mid, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == mid
        deleted = c.delete("/v1/models/" + urllib.parse.quote(mid, safe=""))
        assert deleted.status_code == 200, deleted.text
        check(deleted.json(), MODEL_DELETED)
        assert deleted.json() == {"id": mid, "object": "model", "deleted": True}
        check_error(c.get(f"/v1/models/{mid}"), 404, "model_not_found")
        check_error(c.delete(f"/v1/models/{mid}"), 404, "model_not_found")
    # the linked file behind it is untouched
    assert store.get(M) is not None
    from pathlib import Path

    assert Path(bundled.path).is_file()


def test_delete_with_the_openai_client(inference_server: RunningServer) -> None:
    store = ModelStore(inference_server.settings)
    bundled = store.get(M)
    assert bundled is not None
    store.register(bundled.model_copy(update={"id": "scratch-copy"}))
    client = inference_server.openai()
    out = client.models.delete("scratch-copy")
    assert out.deleted is True and out.id == "scratch-copy"
    with pytest.raises(openai.NotFoundError):
        client.models.delete("scratch-copy")


def test_delete_while_serving_is_409(inference_server: RunningServer) -> None:
    store = ModelStore(inference_server.settings)
    bundled = store.get(M)
    assert bundled is not None
    store.register(bundled.model_copy(update={"id": "busy-copy"}))
    body = {"model": "busy-copy", "messages": [{"role": "user", "content": "Tell a long story."}],
            "stream": True, "max_tokens": 600, "temperature": 1.0, "stop": ["\u0000never"]}
    with inference_server.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for line in lines:
                if '"content"' in line and '"role"' not in line:
                    break  # generating now
            check_error(c.delete("/v1/models/busy-copy"), 409, "model_in_use")
        deadline = time.monotonic() + 30
        while True:
            r2 = c.delete("/v1/models/busy-copy")
            if r2.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r2.status_code == 200, r2.text


def test_download_and_convert_never_fake_success(inference_server: RunningServer) -> None:
    """Until the download/convert module is installed these answer 501; with it, bad input is a 4xx."""
    with inference_server.client() as c:
        r = c.post(f"/v1/models/{M}/download", json={"source": "no-such-source"})
        check_error(r, r.status_code)
        assert r.status_code in (400, 501)
        r = c.post("/v1/models/org/never-there/convert", json={"target_format": "gguf", "quantization": "q4_0"})
        check_error(r, r.status_code)
        assert r.status_code in (404, 501)


# -- providers, storage ------------------------------------------------------------------------
def test_providers(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        providers = c.get("/v1/providers").json()
        assert isinstance(providers, list)
        assert {"id": "local", "status": "available"} in [{k: v for k, v in p.items() if k != "url" or v} for p in providers]
        v = c.post("/v1/providers/local/validate")
        assert v.status_code == 200
        body = v.json()
        assert set(body) == {"provider", "valid", "latency_ms", "models_available"}
        assert body["provider"] == "local" and body["valid"] is True
        assert isinstance(body["latency_ms"], int) and body["models_available"] >= 1
        check_error(c.post("/v1/providers/nope/validate"), 404, "provider_not_found")


def test_storage_stats_and_cleanup(inference_server: RunningServer) -> None:
    settings = inference_server.settings
    junk = settings.tmp_dir / "stale.partial"
    junk.mkdir(parents=True, exist_ok=True)
    (junk / "blob").write_bytes(b"x" * 1000)
    (settings.cache_dir / "c.bin").write_bytes(b"y" * 500)
    with inference_server.client() as c:
        stats = c.get("/v1/storage/stats").json()
        assert set(stats) == {"total_size_bytes", "model_count", "cache_size_bytes", "storage_path"}
        assert stats["model_count"] >= 1 and stats["total_size_bytes"] > 50_000_000
        assert stats["cache_size_bytes"] >= 1500
        assert stats["storage_path"] == str(settings.models_dir)
        out = c.post("/v1/storage/cleanup").json()
        assert out["freed_bytes"] >= 1500
        assert str(junk) in out["removed"]
        assert not junk.exists()
        # the ready model is still there and still works
        assert c.get(f"/v1/models/{M}").status_code == 200
        assert c.post("/v1/embeddings", json={"model": M, "input": "still here"}).status_code == 200


# -- health, status, metrics, docs --------------------------------------------------------------
def test_health_status_metrics(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        assert c.get("/v1/health").json() == {"status": "ok"}
        before = c.get("/v1/status").json()
        c.get("/v1/models")
        status = c.get("/v1/status").json()
        assert status["status"] == "running"
        assert status["version"].count(".") >= 1
        assert isinstance(status["uptime_seconds"], int)
        assert status["providers"]["local"] == "connected"
        assert status["requests_served"] >= before["requests_served"] + 2
        assert isinstance(status["models_loaded"], int)
        c.post("/v1/embeddings", json={"model": M, "input": "load it"})
        assert c.get("/v1/status").json()["models_loaded"] >= 1
        text = c.get("/metrics").text
        for name in (
            "conch_inference_requests_total", "conch_inference_prompt_tokens_total",
            "conch_inference_completion_tokens_total", "conch_inference_time_to_first_token_seconds_count",
            "conch_inference_tokens_per_second", "conch_inference_queue_depth", "conch_inference_models_loaded",
        ):
            assert name in text


def test_openapi_and_swagger(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        doc = c.get("/api-docs/openapi.json").json()
        paths = doc["paths"]
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/models/{model_id}",
                     "/v1/models/{model_id}/download", "/v1/models/{model_id}/convert", "/v1/providers",
                     "/v1/providers/{provider_id}/validate", "/v1/storage/stats", "/v1/storage/cleanup",
                     "/v1/health", "/v1/status"):
            assert path in paths, path
        assert "ChatCompletionRequest" in doc["components"]["schemas"]
        from openapi_spec_validator import validate

        validate(doc)
        ui = c.get("/swagger-ui")
        assert ui.status_code == 200 and "swagger-ui-bundle.js" in ui.text
        assert "cdn" not in ui.text.lower()
        assert c.get("/swagger-ui/assets/swagger-ui-bundle.js").status_code == 200


def test_swagger_off(tmp_path: object) -> None:
    from pathlib import Path

    from fastapi.testclient import TestClient

    from conch.config import Settings
    from conch.web.inference.app import create_app

    app = create_app(Settings(data_dir=Path(str(tmp_path)), enable_openapi=False))
    with TestClient(app) as c:
        check_error(c.get("/swagger-ui"), 404)
        assert c.get("/api-docs/openapi.json").status_code == 200


def test_unknown_route_uses_the_envelope(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        check_error(c.get("/v1/nothing-here"), 404)
        check_error(c.put("/v1/health"), 405)


def test_a_model_that_cannot_load_is_a_model_error(inference_server: RunningServer,
                                                   tmp_path: object) -> None:
    """A stored GGUF that llama.cpp refuses is the model's error (500 model_load_failed,
    naming it), not an internal error; the server goes on serving."""
    from pathlib import Path

    from tests.inference.sources.conftest import make_small_gguf

    path = Path(str(tmp_path)) / "broken.gguf"
    make_small_gguf(path)
    with inference_server.client() as c:
        r = c.post("/v1/models/broken-chat/download", json={"source": "file", "path": str(path)})
        assert r.status_code == 201, r.text
        try:
            body = {"model": "broken-chat", "messages": [{"role": "user", "content": "hi"}]}
            for stream in (False, True):
                failed = c.post("/v1/chat/completions", json={**body, "stream": stream})
                err = check_error(failed, 500, "model_load_failed")
                assert err["param"] == "model" and "broken-chat" in err["message"]
            ok = c.post("/v1/chat/completions", json={
                "model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert ok.status_code == 200
        finally:
            c.delete("/v1/models/broken-chat")
