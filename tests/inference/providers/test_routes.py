"""The providers through conch's inference server, spoken to with the official openai client
and httpx: chat (plain, streamed, tools), embeddings, /v1/models, /v1/providers, validate,
/v1/status and the error statuses, for every provider kind."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conch.config import ProviderConfig
from conch.inference.models.bundled import find_bundled_gguf
from tests.inference.providers import standins
from tests.inference.providers.servers import conch_inference_server, llama_cpp_server
from tests.inference.providers.standins import ANTHROPIC_KEY

pytestmark = pytest.mark.timeout(600)

TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    path = find_bundled_gguf()
    assert path is not None
    with llama_cpp_server(path) as url:
        yield url


@pytest.fixture(scope="module")
def conch(tmp_path_factory: pytest.TempPathFactory, ollama_standin: Any, anthropic_standin: Any,
          llama_url: str) -> Iterator[str]:
    saved = os.environ.pop("OPENAI_API_KEY", None)  # openai must be the provider without a key
    with standins.silent_server() as hung, conch_inference_server(
        tmp_path_factory.mktemp("conch"), n_ctx=1024, n_parallel=2,
        ollama_url=ollama_standin.state.url, anthropic_api_key=ANTHROPIC_KEY, openai_api_key=None,
        provider_timeout_s=60.0, provider_probe_timeout_s=0.5, provider_probe_interval_s=1.0,
        providers={
            "anthropic": ProviderConfig(url=anthropic_standin.state.url),
            "llamacpp": ProviderConfig(url=llama_url),
            "down": ProviderConfig(url=standins.closed_port_url() + "/v1"),
            "hung": ProviderConfig(url=hung + "/v1", timeout_s=2.0),
            "badclaude": ProviderConfig(kind="anthropic", url=anthropic_standin.state.url, api_key="sk-wrong"),
        },
    ) as (url, _app):
        yield url
    if saved is not None:
        os.environ["OPENAI_API_KEY"] = saved


@pytest.fixture()
def client(conch: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=conch, api_key="anything", max_retries=0, timeout=60)


def test_chat_through_each_provider_kind(client: openai.OpenAI) -> None:
    for model, expected in (("ollama:qwen2.5:7b", "echo: hello"), ("anthropic:claude-test-1", "echo: hello")):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.content == expected and reply.model == model
    reply = client.chat.completions.create(model="llamacpp:smollm2", max_tokens=5, temperature=0,
                                           messages=[{"role": "user", "content": "hello"}])
    assert reply.model == "llamacpp:smollm2" and reply.usage is not None and reply.usage.completion_tokens > 0
    local = client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=3,
                                           messages=[{"role": "user", "content": "hello"}])
    assert local.choices[0].message.content is not None


def test_streams_and_tools(client: openai.OpenAI) -> None:
    for model in ("ollama:qwen2.5:7b", "anthropic:claude-test-1", "llamacpp:smollm2"):
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a b c"}],
                                                max_tokens=8, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant", model
        if not model.startswith("llamacpp:"):  # llama-cpp-python's server ignores include_usage
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, model
        assert any(c.choices and c.choices[0].finish_reason for c in chunks), (
            model, [(c.choices[0].delta.content, c.choices[0].finish_reason) if c.choices else c.usage for c in chunks])
    for model in ("ollama:qwen2.5:7b", "anthropic:claude-test-1"):
        reply = client.chat.completions.create(model=model, tools=TOOLS,  # type: ignore[arg-type]
                                               messages=[{"role": "user", "content": "weather in Paris?"}])
        call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert reply.choices[0].finish_reason == "tool_calls"
        assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_embeddings_through_ollama(client: openai.OpenAI) -> None:
    out = client.embeddings.create(model="ollama:nomic-embed-text:latest", input=["a", "b"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == 8


def test_unsupported_fields_are_400_naming_provider_and_field(conch: str) -> None:
    for model, extra, param in (("ollama:qwen2.5:7b", {"n": 2}, "n"), ("anthropic:claude-test-1", {"seed": 3}, "seed")):
        r = httpx.post(f"{conch}/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "x"}], **extra})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and model.split(":")[0] in err["message"]
    r = httpx.post(f"{conch}/embeddings", json={"model": "anthropic:claude-test-1", "input": "x"})
    assert r.status_code == 400 and "anthropic" in r.json()["error"]["message"]


def test_error_statuses(client: openai.OpenAI, conch: str) -> None:
    with pytest.raises(openai.AuthenticationError) as auth:
        client.chat.completions.create(model="badclaude:claude-test-1", messages=[{"role": "user", "content": "x"}])
    assert "badclaude: invalid x-api-key" in str(auth.value) and "sk-wrong" not in str(auth.value)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="ollama:nope:1b", messages=[{"role": "user", "content": "x"}])
    assert "ollama: " in str(missing.value)
    r = httpx.post(f"{conch}/chat/completions", json={"model": "down:x", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502 and r.json()["error"]["message"].startswith("down: ")
    r = httpx.post(f"{conch}/chat/completions", json={"model": "openai:gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and "OPENAI_API_KEY" in r.json()["error"]["message"]
    started = time.monotonic()
    r = httpx.post(f"{conch}/chat/completions", timeout=30,
                   json={"model": "hung:x", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 504 and r.json()["error"]["message"].startswith("hung: ")
    assert time.monotonic() - started < 6  # its timeout_s is 2
    for model in ("anthropic:claude-overloaded", "ollama:slow-die:1b"):  # failing mid-stream
        with httpx.stream("POST", f"{conch}/chat/completions", json={
                "model": model, "stream": True, "messages": [{"role": "user", "content": "a b c d e"}]}) as resp:
            assert resp.status_code == 200
            frames = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert "[DONE]" not in frames
        last = json.loads(frames[-1])
        assert last["error"]["message"].startswith(model.split(":")[0] + ": ")


def test_models_providers_status_validate(conch: str) -> None:
    base = conch.removesuffix("/v1")
    t0 = time.monotonic()
    models = httpx.get(f"{conch}/models", timeout=30).json()["data"]
    first = time.monotonic() - t0
    t0 = time.monotonic()
    httpx.get(f"{conch}/models", timeout=30)
    second = time.monotonic() - t0
    assert first < 2.0 and second < 0.5  # "hung" and "down" never slow it
    owners = {m["id"]: m["owned_by"] for m in models}
    assert owners["ollama:qwen2.5:7b"] == "ollama" and owners["anthropic:claude-test-1"] == "anthropic"
    assert owners["llamacpp:smollm2"] == "llamacpp" and owners.get("smollm2-135m-instruct") == "local"

    time.sleep(1.5)  # a background probe has run
    listed = httpx.get(f"{conch}/providers").json()
    status = {p["id"]: p for p in listed}
    assert status["local"] == {"id": "local", "status": "available"}
    assert status["ollama"]["status"] == "available" and status["ollama"]["url"] == httpx.URL(status["ollama"]["url"]).__str__()
    assert status["down"]["status"] == "unavailable" and status["openai"]["status"] == "unavailable"
    assert ANTHROPIC_KEY not in json.dumps(listed) and "sk-wrong" not in json.dumps(listed)
    providers = httpx.get(f"{conch}/status").json()["providers"]
    assert providers["ollama"] == "connected" and providers["down"] == "configured" and providers["local"] == "connected"

    ok = httpx.post(f"{conch}/providers/anthropic/validate").json()
    assert ok["valid"] is True and ok["models_available"] == len(standins.ANTHROPIC_MODELS) and ok["provider"] == "anthropic"
    bad = httpx.post(f"{conch}/providers/down/validate").json()
    assert bad["valid"] is False and bad["error"].startswith("down: ")
    assert httpx.post(f"{conch}/providers/nope/validate").status_code == 404
    local = httpx.post(f"{conch}/providers/local/validate").json()
    assert local["valid"] is True and local["models_available"] >= 1
    assert httpx.get(f"{base}/v1/health").status_code == 200


def test_ai_and_embed_through_providers_in_the_agent_server(conch: str, tmp_path: Path) -> None:
    from tests.web.agent_fixtures import start_agent_server

    server = start_agent_server(tmp_path / "agent", workers=1, models_url=conch)
    try:
        with server.client() as c:
            body = c.post("/api/v1/eval", json={"code": 'ai("hi", model="anthropic:claude-test-1", system="sys")'}).json()
            assert body["value"] == "[sys] echo: hi", body
            body = c.post("/api/v1/eval", json={"code": 'embed(["a", "b"], model="ollama:nomic-embed-text:latest") | map(len)'}).json()
            assert body["value"] == [8, 8], body
            body = c.post("/api/v1/eval", json={"code": 'ai("x", model="down:m")'}).json()
            assert body["error"]["kind"] == "ProviderError" and "down: " in body["error"]["message"]
    finally:
        server.stop()
