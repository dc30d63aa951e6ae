"""OpenAI-compatible providers against real servers that run here: llama-cpp-python's own
server and a second conch inference server (both serving the bundled SmolLM2)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conch.config import ProviderConfig, Settings
from conch.inference.models.bundled import find_bundled_gguf
from conch.inference.remote.errors import ProviderRejected
from conch.inference.remote.registry import ProviderRegistry
from tests.inference.providers.servers import conch_inference_server, llama_cpp_server

pytestmark = pytest.mark.timeout(600)

KEY = "sk-llama-test"


@pytest.fixture(scope="module")
def model_path() -> Path:
    path = find_bundled_gguf()
    assert path is not None
    return path


@pytest.fixture(scope="module")
def llama_url(model_path: Path) -> Iterator[str]:
    with llama_cpp_server(model_path, api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def conch_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with conch_inference_server(tmp_path_factory.mktemp("conch2"), n_ctx=1024, n_parallel=2) as (url, _app):
        yield url


@pytest.fixture()
def registry(tmp_path: Path, llama_url: str, conch_url: str) -> Iterator[ProviderRegistry]:
    settings = Settings(data_dir=tmp_path, provider_timeout_s=60, provider_probe_timeout_s=5, providers={
        "llamacpp": ProviderConfig(url=llama_url, api_key=KEY),
        "conch2": ProviderConfig(url=conch_url),
        "badkey": ProviderConfig(url=llama_url, api_key="sk-wrong"),
    })
    yield ProviderRegistry(settings)


@pytest.fixture()
def run() -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


def test_chat_and_stream_through_llama_cpp_server(registry: ProviderRegistry, run: Any) -> None:
    provider, model = registry.route("llamacpp:smollm2")  # type: ignore[misc]
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0, "seed": 1}
    out = run(provider.chat(model, body))
    assert out["model"] == "llamacpp:smollm2" and out["object"] == "chat.completion"
    assert out["choices"][0]["finish_reason"] in ("stop", "length") and out["usage"]["completion_tokens"] > 0

    async def stream() -> list[dict[str, Any]]:
        chunks = await provider.chat_stream(model, {**body, "stream_options": {"include_usage": True}})
        return [c async for c in chunks]

    chunks = run(stream())
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == out["choices"][0]["message"]["content"]  # greedy: the same tokens both ways
    assert all(c["model"] == "llamacpp:smollm2" for c in chunks)


def test_bad_key_is_the_providers_401(registry: ProviderRegistry, run: Any) -> None:
    provider, model = registry.route("badkey:smollm2")  # type: ignore[misc]
    with pytest.raises(ProviderRejected) as err:
        run(provider.chat(model, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
    assert err.value.status == 401 and err.value.message.startswith("badkey: ")
    assert "sk-wrong" not in err.value.message


def test_another_conch_server_with_tools_and_json_schema(registry: ProviderRegistry, run: Any) -> None:
    provider, _ = registry.route("conch2:smollm2-135m-instruct")  # type: ignore[misc]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    out = run(provider.chat("smollm2-135m-instruct", {
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
        "tool_choice": "required", "max_tokens": 40, "temperature": 0}))
    call = out["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather" and "city" in json.loads(call["function"]["arguments"])
    assert out["choices"][0]["finish_reason"] == "tool_calls"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = run(provider.chat("smollm2-135m-instruct", {
        # llama.cpp's grammar allows up to 16 digits: room for the longest answer it admits
        "messages": [{"role": "user", "content": "A number"}], "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}))
    assert isinstance(json.loads(out["choices"][0]["message"]["content"])["n"], int)

    with pytest.raises(ProviderRejected) as err:
        run(provider.chat("no-such-model", {"messages": [{"role": "user", "content": "x"}]}))
    assert err.value.status == 404 and err.value.message.startswith("conch2: ")
    assert err.value.code == "model_not_found"


def test_validate_and_models(registry: ProviderRegistry, run: Any) -> None:
    async def go() -> tuple[Any, ...]:
        a = await registry.validate("llamacpp")
        b = await registry.validate("conch2")
        c = await registry.validate("badkey")
        models = await registry.models()
        await registry.close()
        return a, b, c, models

    a, b, c, models = run(go())
    assert a["valid"] and a["models_available"] == 1
    assert b["valid"] and b["models_available"] >= 1
    assert not c["valid"] and "badkey" in c["error"]
    ids = {m["id"] for m in models}
    assert "llamacpp:smollm2" in ids and "conch2:smollm2-135m-instruct" in ids


def test_streams_reuse_one_upstream_connection(registry: ProviderRegistry, run: Any) -> None:
    # A relayed stream is read to the end of its body: a response closed at `data: [DONE]`
    # with bytes still unread takes its connection with it, and every request paid a new one.
    provider, model = registry.route("llamacpp:smollm2")  # type: ignore[misc]
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}

    async def streams() -> list[int]:
        pool = provider._stream_client()._transport._pool  # type: ignore[attr-defined]
        opened = []
        for _ in range(3):
            chunks = await provider.chat_stream(model, body)
            assert [c async for c in chunks]
            opened.append(len(pool.connections))
        return opened

    assert run(streams()) == [1, 1, 1]
