"""The download/convert routes over HTTP: 201 with the model, SSE progress, 400/404/409/502."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conch.config import Settings
from conch.inference.models.store import ModelStore
from conch.web.inference.app import create_app
from tests.inference.sources.conftest import make_small_gguf
from tests.inference.sources.servers import FileServer, HubRepo, HubServer

# A hang (a stuck socket or thread) fails the test instead of stalling the suite.
pytestmark = pytest.mark.timeout(300)

pytest.importorskip("llama_cpp")


@pytest.fixture
def client(settings: Settings, store: ModelStore) -> TestClient:
    # Without the lifespan (no `with`): these tests need the routes, not the bundled model.
    return TestClient(create_app(settings))


@pytest.fixture
def gguf_bytes(tmp_path: Path) -> bytes:
    return make_small_gguf(tmp_path / "t.gguf")


def _sse(text: str) -> list[Any]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_download_blocks_and_answers_201(client: TestClient, gguf_bytes: bytes) -> None:
    server = FileServer({"t.gguf": gguf_bytes})
    with server.run() as base:
        r = client.post("/v1/models/org/tiny/download", json={"source": "url", "url": f"{base}/t.gguf"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["id"] == "org/tiny" and body["status"] == "ready" and body["format"] == "gguf"
    assert body["source"] == "url" and body["sha256"]


def test_download_stream_reports_progress_then_the_model(client: TestClient, gguf_bytes: bytes) -> None:
    server = FileServer({"t.gguf": gguf_bytes})
    with server.run() as base:
        r = client.post("/v1/models/tiny/download",
                        json={"source": "url", "url": f"{base}/t.gguf", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _sse(r.text)
    assert events[-1] == "[DONE]"
    progress, final = events[:-2], events[-2]
    assert progress and all({"status", "completed", "total"} <= set(e) for e in progress)
    assert final["id"] == "tiny" and final["status"] == "ready"


def test_huggingface_download_through_the_route(client: TestClient, settings: Settings,
                                                 gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = HubServer({"org/tiny-GGUF": HubRepo({"tiny.Q8_0.gguf": gguf_bytes, "tiny.F16.gguf": gguf_bytes})})
    with hub.run() as endpoint:
        settings.hf_endpoint = endpoint
        r = client.post("/v1/models/tiny-q8/download",
                        json={"source": "huggingface", "repo": "org/tiny-GGUF", "files": "*Q8_0.gguf"})
    assert r.status_code == 201, r.text
    assert r.json()["revision"] == hub.repos["org/tiny-GGUF"].commit
    assert r.json()["files"] == ["tiny.Q8_0.gguf"]


def test_errors(client: TestClient, store: ModelStore) -> None:
    r = client.post("/v1/models/x/download", json={"source": "bittorrent"})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    for name in ("huggingface", "url", "pypi", "ollama", "file"):
        assert name in msg
    r = client.post("/v1/models/x/download", json={"source": "url", "url": "http://127.0.0.1:9/x.gguf"})
    assert r.status_code == 502 and "127.0.0.1:9" in r.json()["error"]["message"]
    assert store.get("x") is None
    r = client.post("/v1/models/nope/convert", json={"target_format": "gguf", "quantization": "q4_0"})
    assert r.status_code == 404
    r = client.post("/v1/models/x/download", json={})
    assert r.status_code == 400


def test_concurrent_download_of_same_id_is_409(client: TestClient, store: ModelStore, gguf_bytes: bytes) -> None:
    server = FileServer({"t.gguf": gguf_bytes})
    server.gate = threading.Event()  # holds the first download mid-way
    with server.run() as base:
        first: dict[str, Any] = {}
        t = threading.Thread(target=lambda: first.update(r=client.post(
            "/v1/models/tiny/download", json={"source": "url", "url": f"{base}/t.gguf"})))
        t.start()
        try:
            for _ in range(500):
                rec = store.get("tiny")
                if rec is not None and rec.status == "downloading":
                    break
                threading.Event().wait(0.02)
            r = client.post("/v1/models/tiny/download", json={"source": "url", "url": f"{base}/t.gguf"})
            assert r.status_code == 409
        finally:
            server.gate.set()
            t.join(30)
    assert first["r"].status_code == 201


def test_convert_and_unsupported_pairs(client: TestClient, gguf_bytes: bytes, tmp_path: Path) -> None:
    from tests.inference.convert.tiny_llama import make_tiny_llama

    src = tmp_path / "tiny-llama"
    make_tiny_llama(src)
    r = client.post("/v1/models/tiny-llama/download", json={"source": "file", "path": str(src)})
    assert r.status_code == 201 and r.json()["format"] == "safetensors"
    r = client.post("/v1/models/tiny-llama/convert", json={"target_format": "gguf", "quantization": "q8_0"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["id"] == "tiny-llama-q8_0" and body["converted_from"] == "tiny-llama"
    assert body["quantization"] == "q8_0" and body["format"] == "gguf"
    r = client.post("/v1/models/tiny-llama-q8_0/convert",
                    json={"quantization": "q4_k_m", "output_id": "tl-q4", "stream": True})
    events = _sse(r.text)
    assert events[-2]["id"] == "tl-q4" and events[-2]["quantization"] == "q4_k_m"
    r = client.post("/v1/models/tl-q4/convert", json={"target_format": "onnx"})
    assert r.status_code == 400 and "safetensors -> gguf" in r.json()["error"]["message"]
    r = client.post("/v1/models/tl-q4/convert", json={"target_format": "tflite"})
    assert r.status_code == 400 and "gguf" in r.json()["error"]["message"]
    r = client.post("/v1/models/tiny-llama/convert", json={"quantization": "q4_k_m", "output_id": "tl-q4"})
    assert r.status_code == 409
