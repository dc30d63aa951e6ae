"""The models' memory budget over HTTP, with real models and the vendors' clients: footprints in
``GET /v1/models/{id}`` and ``/api/ps``, ``POST /v1/models/{id}/load`` with load settings,
``/v1/status``'s memory, requests queued until memory frees, ``503 insufficient_memory`` in
each API's envelope, and ``conch models ps``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from conch.config import Settings
from conch.inference.models.store import ModelRecord
from conch.inference.serving import memory
from tests.inference.budget_models import MINILM, TINY, make_models
from tests.web.conftest import RunningServer, start_server

SMOL = "smollm2-135m-instruct"  # the bundled model, registered by the server itself
SRC = str(Path(__file__).resolve().parents[2] / "src")
MiB = 1 << 20
# The busy streams below must stay busy for seconds: no drafting (drafts would finish them
# sooner), and room in SmolLM2's context for thousands of tokens.
SETTINGS: dict[str, Any] = {"n_ctx": 512, "n_parallel": 2, "max_loaded_models": 3, "draft_max": 0,
                            "model_overrides": {SMOL: {"n_ctx": 4096}}}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from conch.inference.models.bundled import find_bundled_gguf

    smol = find_bundled_gguf()
    assert smol is not None
    return make_models(tmp_path_factory.mktemp("budget-web-models"), smol)


def _estimate(path: Path, model_id: str, tmp: Path) -> int:
    record = ModelRecord(id=model_id, path=str(path))
    return memory.estimate(record, Settings(data_dir=tmp, **SETTINGS)).footprint.total_bytes


@pytest.fixture(scope="module")
def sizes(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    tmp = tmp_path_factory.mktemp("estimates")
    return {SMOL: _estimate(files["smol"], SMOL, tmp), TINY: _estimate(files[TINY], TINY, tmp),
            MINILM: _estimate(files[MINILM], MINILM, tmp)}


def _serve(tmp_path: Path, files: dict[str, Path], **overrides: Any) -> tuple[RunningServer, Any, threading.Thread]:
    running, server, thread = start_server(tmp_path / "data", **{**SETTINGS, **overrides})
    with running.client() as c:
        for mid in (TINY, MINILM):
            r = c.post(f"/v1/models/{mid}/download", json={"source": "file", "path": str(files[mid])})
            assert r.status_code == 201, r.text
    return running, server, thread


@pytest.fixture()
def roomy(tmp_path: Path, files: dict[str, Path]) -> Iterator[RunningServer]:
    """A budget that holds every model."""
    running, server, thread = _serve(tmp_path, files, memory_budget_mb=2048)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


@pytest.fixture()
def tight(tmp_path: Path, files: dict[str, Path], sizes: dict[str, int]) -> Iterator[RunningServer]:
    """SmolLM2 or the tiny model, never both; a request waits a second for memory."""
    budget = -(-(sizes[SMOL] + sizes[TINY] // 2) // MiB)
    running, server, thread = _serve(tmp_path, files, memory_budget_mb=budget, memory_wait_s=1.0)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _error(r: httpx.Response, status: int, code: str, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err
    return err


def test_details_show_the_footprint_and_load_applies_per_model_settings(roomy: RunningServer,
                                                                         sizes: dict[str, int]) -> None:
    import ollama

    with roomy.client() as c:
        before = c.get(f"/v1/models/{TINY}").json()
        assert before["loaded"] is False and before["overrides"] == {} and before["expires_at"] is None
        fp = before["footprint"]
        assert fp["estimated_bytes"] == sizes[TINY] == fp["bytes"] and fp["measured_bytes"] is None
        assert (fp["n_ctx"], fp["kv_cells"]) == (512, 512)  # one pool of n_ctx cells
        assert fp["weights_bytes"] + fp["kv_bytes"] + fp["compute_bytes"] == fp["estimated_bytes"]

        r = c.post(f"/v1/models/{TINY}/load", json={"n_ctx": 256, "n_threads": 1, "keep_alive": "10m"})
        assert r.status_code == 200, r.text
        loaded = r.json()
        assert loaded["loaded"] is True and loaded["overrides"] == {"n_ctx": 256, "n_threads": 1}
        fp = loaded["footprint"]
        assert fp["n_ctx"] == 256 and fp["kv_cells"] == 256 and fp["measured_bytes"] > 0
        assert fp["bytes"] == fp["measured_bytes"] and abs(fp["measured_bytes"] - fp["estimated_bytes"]) < 0.1 * fp["bytes"]
        assert loaded["expires_at"] is not None and c.get(f"/v1/models/{TINY}").json()["footprint"] == fp

        # Ollama's /api/ps: size is the footprint the budget counts, the context as loaded.
        ps = {m.model: m for m in ollama.Client(host=roomy.url).ps().models}
        assert ps[TINY].size == fp["bytes"] and ps[TINY].size_vram == 0 and ps[TINY].context_length == 256
        status = c.get("/v1/status").json()["memory"]
        assert status["budget_bytes"] == 2048 * MiB and status["basis"] == "memory_budget_mb"
        assert status["used_bytes"] == fp["bytes"] and status["free_bytes"] == 2048 * MiB - fp["bytes"]
        samples = dict(line.rsplit(" ", 1) for line in c.get("/metrics").text.splitlines()
                       if line.startswith(("conch_inference_memory", "conch_inference_model_memory")))
        assert float(samples["conch_inference_memory_budget_bytes"]) == 2048 * MiB
        assert float(samples["conch_inference_memory_used_bytes"]) == fp["bytes"]
        assert float(samples[f'conch_inference_model_memory_bytes{{model="{TINY}"}}']) == fp["bytes"]

        # A request is served with the settings loaded.
        chat = roomy.openai().chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
        assert chat.usage is not None and chat.usage.completion_tokens >= 1

        # Refusals name the field; nothing changes.
        err = _error(c.post(f"/v1/models/{TINY}/load", json={"n_cxt": 1024}), 400, "invalid_request_error", "n_cxt")
        assert "Unknown load setting 'n_cxt'" in err["message"] and "n_ctx" in err["message"]
        _error(c.post(f"/v1/models/{TINY}/load", json={"n_ctx": -1}), 400, "invalid_request_error", "n_ctx")
        _error(c.post(f"/v1/models/{TINY}/load", json={"flash_attn": "maybe"}), 400, "invalid_request_error",
               "flash_attn")
        _error(c.post(f"/v1/models/{TINY}/load", json={"keep_alive": "soon"}), 400, "invalid_request_error",
               "keep_alive")
        _error(c.post(f"/v1/models/{TINY}/load", content=b"{not json", headers={"content-type": "application/json"}),
               400, "invalid_json", None)
        _error(c.post("/v1/models/no-such-model/load", json={}), 404, "model_not_found", "model")
        # Settings that do not fit are refused at once, and not kept.
        # (Plain attention over micro-batches of 8,192 tokens in SmolLM2's whole context: the
        # scores alone would take 2.3 GiB. llama.cpp caps a micro-batch at the context, so a
        # larger one would not ask for more.)
        err = _error(c.post(f"/v1/models/{SMOL}/load", json={"n_ctx": 8192, "n_batch": 8192, "n_ubatch": 8192,
                                                              "flash_attn": "off"}),
                     503, "insufficient_memory", "model")
        assert "more than the whole memory budget" in err["message"]
        assert c.get(f"/v1/models/{SMOL}").json()["loaded"] is False
        kept = c.get(f"/v1/models/{TINY}").json()
        assert kept["overrides"] == {"n_ctx": 256, "n_threads": 1} and kept["loaded"] is True
        assert kept["footprint"] == fp  # the loaded model was not disturbed

        # null: back to the server's setting; an empty body loads as configured.
        back = c.post(f"/v1/models/{TINY}/load", json={"n_ctx": None, "n_threads": None}).json()
        assert back["overrides"] == {} and back["footprint"]["n_ctx"] == 512
        assert c.post(f"/v1/models/{MINILM}/load").json()["loaded"] is True


def test_an_embedding_request_is_counted_on_the_model(roomy: RunningServer) -> None:
    with roomy.client() as c:
        out = roomy.openai().embeddings.create(model=MINILM, input=["a cat", "a dog"])
        assert len(out.data[0].embedding) == 384
        fp = c.get(f"/v1/models/{MINILM}").json()["footprint"]
        # The encoder's context opened with the first input: measured now, and close to the estimate.
        assert fp["measured_bytes"] is not None and abs(fp["measured_bytes"] - fp["estimated_bytes"]) < 0.1 * fp["bytes"]


def _long_stream(server: RunningServer, started: threading.Event, stop: threading.Event, model: str = SMOL) -> None:
    """A streaming chat that keeps ``model`` busy until ``stop`` (end-of-text tokens banned)."""
    body = {"model": model, "stream": True, "max_tokens": 3500 if model == SMOL else 400, "temperature": 0,
            "logit_bias": {"0": -100, "1": -100, "2": -100}, "messages": [{"role": "user", "content": "Count."}]}
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            started.set()
            if stop.is_set():
                return


def test_a_request_that_cannot_fit_gets_503_in_each_api_envelope(tight: RunningServer, sizes: dict[str, int]) -> None:
    import anthropic
    import ollama
    import openai

    started, stop = threading.Event(), threading.Event()
    busy = threading.Thread(target=_long_stream, args=(tight, started, stop), daemon=True)
    busy.start()
    try:
        assert started.wait(120)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as oa:
            tight.openai().chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=2)
        assert time.monotonic() - t0 >= 1.0  # it waited memory_wait_s first
        assert oa.value.status_code == 503 and oa.value.code == "insufficient_memory"
        body = oa.value.body
        assert isinstance(body, dict) and body["param"] == "model" and body["type"] == "provider_error"
        message = str(body["message"])
        assert f"'{TINY}' needs ~{(sizes[TINY] + MiB // 2) // MiB:,} MB" in message and SMOL in message

        with pytest.raises(ollama.ResponseError) as ol:
            ollama.Client(host=tight.url).chat(model=TINY, messages=[{"role": "user", "content": "hi"}])
        assert ol.value.status_code == 503 and "needs ~" in ol.value.error and "memory budget" in ol.value.error

        with pytest.raises(anthropic.APIStatusError) as an:
            anthropic.Anthropic(base_url=tight.url, api_key="x", max_retries=0).messages.create(
                model=TINY, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert an.value.status_code == 503
        assert isinstance(an.value.body, dict) and an.value.body["error"]["type"] == "overloaded_error"
        with tight.client() as c:
            assert [m["name"] for m in c.get("/api/ps").json()["models"]] == [SMOL]  # the busy model served on
    finally:
        stop.set()
        busy.join(60)
    # Once SmolLM2 is idle (the server sees the client leave, and cancels its stream), the tiny
    # model takes its place.
    deadline = time.monotonic() + 60
    while True:
        try:
            chat = tight.openai().chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}],
                                                          max_tokens=2)
            break
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline
    assert chat.model == TINY
    with tight.client() as c:
        assert [m["name"] for m in c.get("/api/ps").json()["models"]] == [TINY]


def test_a_request_waits_in_the_queue_until_memory_frees(tmp_path: Path, files: dict[str, Path],
                                                          sizes: dict[str, int]) -> None:
    budget = -(-(sizes[SMOL] + sizes[TINY] // 2) // MiB)
    running, server, thread = _serve(tmp_path, files, memory_budget_mb=budget, memory_wait_s=120)
    try:
        started, stop = threading.Event(), threading.Event()
        busy = threading.Thread(target=_long_stream, args=(running, started, stop), daemon=True)
        busy.start()
        assert started.wait(120)
        answer: dict[str, Any] = {}

        def ask() -> None:
            answer["r"] = running.openai().chat.completions.create(
                model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=2)

        waiting = threading.Thread(target=ask, daemon=True)
        waiting.start()
        waiting.join(3)
        assert waiting.is_alive() and "r" not in answer  # queued behind the busy model, not refused
        stop.set()
        busy.join(60)
        waiting.join(120)
        assert answer["r"].model == TINY
        with running.client() as c:
            assert [m["name"] for m in c.get("/api/ps").json()["models"]] == [TINY]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        db.dispose_all()


def test_conch_models_ps_lists_the_loaded_models_and_the_budget(roomy: RunningServer) -> None:
    with roomy.client() as c:
        assert c.post(f"/v1/models/{TINY}/load", json={"keep_alive": -1}).status_code == 200
    env = dict(os.environ, CONCH_DATA_DIR=str(roomy.settings.data_dir),
               CONCH_MODELS_PORT=str(roomy.settings.models_port),
               CONCH_CONFIG=str(roomy.settings.data_dir / "none.toml"),
               PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "conch.cli.main", "models", "ps", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (entry,) = data["models"]
    assert entry["name"] == TINY and entry["expires_at"].startswith("9999")
    assert entry["footprint"]["measured_bytes"] == entry["size"] and entry["footprint"]["estimated_bytes"] > 0
    assert data["memory"]["budget_bytes"] == 2048 * MiB and data["memory"]["used_bytes"] == entry["size"]
    text = subprocess.run([sys.executable, "-m", "conch.cli.main", "models", "ps"], capture_output=True, text=True,
                          env={**env, "COLUMNS": "160"}, timeout=120).stdout
    assert "NAME" in text and "MEASURED" in text and TINY in text and "100% CPU" in text and "forever" in text
    assert "memory budget:" in text
    # No server: a clear error, not a traceback.
    env["CONCH_MODELS_PORT"] = "9"
    down = subprocess.run([sys.executable, "-m", "conch.cli.main", "models", "ps"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert down.returncode == 1 and "no inference server answers" in down.stderr
