"""Conch's providers against the Ollama and Anthropic stand-ins, through the registry:
routing, translation both ways, streaming, errors, probing and the model cache."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from conch.config import ProviderConfig, Settings
from conch.inference.remote.errors import (
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    ProviderUnreachable,
    UnknownProvider,
    UnsupportedByProvider,
)
from conch.inference.remote.registry import ProviderRegistry
from tests.inference.providers import standins
from tests.inference.providers.standins import ANTHROPIC_KEY

TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def make_registry(tmp_path: Any, ollama: str, anthropic: str, key: str = ANTHROPIC_KEY, **over: Any) -> ProviderRegistry:
    settings = Settings(
        data_dir=tmp_path, ollama_url=ollama, anthropic_api_key=key, openai_api_key=None,
        providers={"anthropic": ProviderConfig(url=anthropic)},
        provider_timeout_s=over.pop("provider_timeout_s", 5.0), provider_probe_timeout_s=0.5, **over,
    )
    registry = ProviderRegistry(settings)
    _opened.append(registry)
    return registry


_loop: asyncio.AbstractEventLoop | None = None
_opened: list[ProviderRegistry] = []


@pytest.fixture(autouse=True)
def event_loop_per_test() -> Any:
    """One loop per test: a provider's connection pool belongs to the loop that opened it, so
    every registry a test made is closed on that loop before it closes (a client left open
    would be closed by the garbage collector on whatever loop runs next)."""
    global _loop
    _loop = asyncio.new_event_loop()
    yield
    while _opened:
        _loop.run_until_complete(_opened.pop().close())
    _loop.close()
    _loop = None


def run(coro: Any) -> Any:
    assert _loop is not None
    return _loop.run_until_complete(coro)


async def collect(stream: Any) -> list[dict[str, Any]]:
    return [chunk async for chunk in stream]


@pytest.fixture()
def registry(tmp_path: Any, ollama_standin: Any, anthropic_standin: Any, monkeypatch: pytest.MonkeyPatch) -> ProviderRegistry:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return make_registry(tmp_path, ollama_standin.state.url, anthropic_standin.state.url)


# -- routing -------------------------------------------------------------------------------------
def test_routing_splits_at_the_first_colon(registry: ProviderRegistry) -> None:
    provider, model = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    assert (provider.id, model) == ("ollama", "qwen2.5:7b")
    assert registry.route("local:smollm2-135m-instruct") is None
    assert registry.route("smollm2-135m-instruct") is None
    assert registry.route("HuggingFaceTB/SmolLM2:q4") is None  # no known prefix: a local id
    with pytest.raises(ProviderUnavailable) as err:
        registry.route("openai:gpt-4o-mini")  # no key set
    assert err.value.status == 503 and "openai" in err.value.message and "OPENAI_API_KEY" in err.value.message


def test_listing_never_shows_a_key(registry: ProviderRegistry) -> None:
    listed = registry.listing()
    assert [p["id"] for p in listed][:4] == ["local", "ollama", "openai", "anthropic"]
    assert ANTHROPIC_KEY not in json.dumps(listed)
    assert {p["id"]: p["status"] for p in listed}["openai"] == "unavailable"


# -- ollama ----------------------------------------------------------------------------------------
def test_ollama_chat_translates_both_ways(registry: ProviderRegistry, ollama_standin: Any) -> None:
    provider, model = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    out = run(provider.chat(model, {"messages": [{"role": "system", "content": "sys"},
                                                 {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                    "temperature": 0.2, "top_p": 0.9, "seed": 7, "max_tokens": 50,
                                    "stop": "zzz"}))
    assert out["object"] == "chat.completion" and out["model"] == "ollama:qwen2.5:7b"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "[sys] echo: hi"}
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["prompt_tokens"] == 7
    sent = ollama_standin.state.requests[-1]
    assert sent["options"] == {"temperature": 0.2, "top_p": 0.9, "seed": 7, "num_predict": 50, "stop": ["zzz"]}

    cut = run(provider.chat(model, {"messages": [{"role": "user", "content": "a b c d e f"}], "max_tokens": 2}))
    assert cut["choices"][0]["finish_reason"] == "length"


def test_ollama_tools_round_trip(registry: ProviderRegistry, ollama_standin: Any) -> None:
    provider, model = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    first = run(provider.chat(model, {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": TOOLS}))
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    second = run(provider.chat(model, {"messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}], "tools": TOOLS}))
    assert second["choices"][0]["message"]["content"] == "the tool said sunny"
    sent = ollama_standin.state.requests[-1]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_name": "weather"}


def test_ollama_stream_and_json_format(registry: ProviderRegistry, ollama_standin: Any) -> None:
    provider, model = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]

    async def go() -> list[dict[str, Any]]:
        stream = await provider.chat_stream(model, {"messages": [{"role": "user", "content": "one two"}],
                                                    "stream_options": {"include_usage": True}})
        return await collect(stream)

    chunks = run(go())
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "echo: one two"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)

    out = run(provider.chat(model, {"messages": [{"role": "user", "content": "x"}],
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "c", "schema": {"type": "object"}}}}))
    assert json.loads(out["choices"][0]["message"]["content"]) == {"colour": "blue"}
    assert ollama_standin.state.requests[-1]["format"] == {"type": "object"}


def test_ollama_refuses_what_it_cannot_do(registry: ProviderRegistry) -> None:
    provider, model = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    msgs = [{"role": "user", "content": "x"}]
    for body, param in (({"n": 2}, "n"), ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
                        ({"logprobs": True}, "logprobs")):
        with pytest.raises(UnsupportedByProvider) as err:
            run(provider.chat(model, {"messages": msgs, **body}))
        assert err.value.status == 400 and err.value.param == param and "ollama" in err.value.message


def test_ollama_unknown_model_is_its_404(registry: ProviderRegistry) -> None:
    provider, _ = registry.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    with pytest.raises(ProviderRejected) as err:
        run(provider.chat("missing:1b", {"messages": [{"role": "user", "content": "x"}]}))
    assert err.value.status == 404 and err.value.message.startswith("ollama: ") and "not found" in err.value.message

    async def go() -> None:
        await provider.chat_stream("missing:1b", {"messages": [{"role": "user", "content": "x"}]})

    with pytest.raises(ProviderRejected):  # a stream learns it before the first chunk
        run(go())


def test_ollama_embeddings(registry: ProviderRegistry) -> None:
    provider, model = registry.route("ollama:nomic-embed-text:latest")  # type: ignore[misc]
    out = run(provider.embed(model, {"input": ["a", "b"]}))
    assert out["model"] == "ollama:nomic-embed-text:latest"
    assert [d["index"] for d in out["data"]] == [0, 1] and len(out["data"][0]["embedding"]) == 8
    with pytest.raises(UnsupportedByProvider):
        run(provider.embed(model, {"input": [[1, 2, 3]]}))


def test_ollama_dies_mid_stream(registry: ProviderRegistry) -> None:
    provider, model = registry.route("ollama:slow-die:1b")  # type: ignore[misc]

    async def go() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        stream = await provider.chat_stream(model, {"messages": [{"role": "user", "content": "a b c d e"}]})
        with pytest.raises(ProviderUnreachable) as err:
            async for chunk in stream:
                got.append(chunk)
        assert err.value.message.startswith("ollama: ")
        return got

    assert len(run(go())) >= 2  # what came before the break was delivered


# -- anthropic ---------------------------------------------------------------------------------------
def test_anthropic_translation(registry: ProviderRegistry, anthropic_standin: Any) -> None:
    provider, model = registry.route("anthropic:claude-test-1")  # type: ignore[misc]
    out = run(provider.chat(model, {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"}], "stop": ["zz"], "temperature": 0.5, "user": "u1"}))
    assert out["choices"][0]["message"]["content"] == "[be brief] echo: second"
    assert out["model"] == "anthropic:claude-test-1" and out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 4
    sent = anthropic_standin.state.requests[-1]
    assert sent["system"] == "be brief" and sent["stop_sequences"] == ["zz"]
    assert [t["role"] for t in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["max_tokens"] == 4096 and sent["metadata"] == {"user_id": "u1"} and sent["temperature"] == 0.5

    stopped = run(provider.chat(model, {"messages": [{"role": "user", "content": "a b STOP c"}], "stop": "STOP"}))
    assert stopped["choices"][0]["finish_reason"] == "stop"
    cut = run(provider.chat(model, {"messages": [{"role": "user", "content": "a b c d e"}], "max_tokens": 2}))
    assert cut["choices"][0]["finish_reason"] == "length"


def test_anthropic_tools_both_ways(registry: ProviderRegistry, anthropic_standin: Any) -> None:
    provider, model = registry.route("anthropic:claude-test-1")  # type: ignore[misc]
    first = run(provider.chat(model, {"messages": [{"role": "user", "content": "weather?"}],
                                      "tools": TOOLS, "tool_choice": "required"}))
    assert anthropic_standin.state.requests[-1]["tool_choice"] == {"type": "any"}
    assert anthropic_standin.state.requests[-1]["tools"][0]["input_schema"]["required"] == ["city"]
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    call = choice["message"]["tool_calls"][0]
    second = run(provider.chat(model, {"messages": [
        {"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "rain"}], "tools": TOOLS}))
    assert second["choices"][0]["message"]["content"] == "the tool said rain"
    sent = anthropic_standin.state.requests[-1]["messages"]
    assert sent[1]["content"][0] == {"type": "tool_use", "id": call["id"], "name": "weather", "input": {"city": "Paris"}}
    assert sent[2]["content"][0] == {"type": "tool_result", "tool_use_id": call["id"], "content": "rain"}


def test_anthropic_stream_with_tool_calls_and_usage(registry: ProviderRegistry) -> None:
    provider, model = registry.route("anthropic:claude-test-1")  # type: ignore[misc]

    async def go() -> list[dict[str, Any]]:
        stream = await provider.chat_stream(model, {"messages": [{"role": "user", "content": "weather?"}],
                                                    "tools": TOOLS, "stream_options": {"include_usage": True}})
        return await collect(stream)

    chunks = run(go())
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Let me check."
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "weather" and calls[0]["id"].startswith("toolu_")
    assert json.loads("".join(tc["function"]["arguments"] for tc in calls)) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] > 0 and chunks[-1]["usage"]["prompt_tokens"] > 0


def test_anthropic_structured_output_and_refusals(registry: ProviderRegistry, anthropic_standin: Any) -> None:
    def registry_requests(_: Any) -> dict[str, Any]:
        return dict(anthropic_standin.state.requests[-1])

    provider, model = registry.route("anthropic:claude-test-1")  # type: ignore[misc]
    msgs = [{"role": "user", "content": "x"}]
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}}
    out = run(provider.chat(model, {"messages": msgs, "response_format": {
        "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}))
    assert json.loads(out["choices"][0]["message"]["content"]) == {"colour": "blue"}
    assert registry_requests(provider)["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    for body, param in (({"seed": 1}, "seed"), ({"n": 3}, "n"), ({"temperature": 1.5}, "temperature"),
                        ({"response_format": {"type": "json_object"}}, "response_format"),
                        ({"frequency_penalty": 0.5}, "frequency_penalty")):
        with pytest.raises(UnsupportedByProvider) as err:
            run(provider.chat(model, {"messages": msgs, **body}))
        assert err.value.param == param and err.value.status == 400 and "anthropic" in err.value.message
    with pytest.raises(UnsupportedByProvider):
        run(provider.embed(model, {"input": "x"}))


def test_anthropic_bad_key_is_its_401(tmp_path: Any, ollama_standin: Any, anthropic_standin: Any) -> None:
    reg = make_registry(tmp_path, ollama_standin.state.url, anthropic_standin.state.url, key="sk-ant-wrong")
    provider, model = reg.route("anthropic:claude-test-1")  # type: ignore[misc]
    with pytest.raises(ProviderRejected) as err:
        run(provider.chat(model, {"messages": [{"role": "user", "content": "x"}]}))
    assert err.value.status == 401 and err.value.message == "anthropic: invalid x-api-key"
    assert "sk-ant-wrong" not in err.value.message
    result = run(reg.validate("anthropic"))
    assert result["valid"] is False and "invalid x-api-key" in result["error"]


def test_anthropic_error_event_mid_stream(registry: ProviderRegistry) -> None:
    for name in ("anthropic:claude-overloaded", "anthropic:claude-die"):
        provider, model = registry.route(name)  # type: ignore[misc]

        async def go(provider: Any = provider, model: str = model) -> int:
            got = 0
            stream = await provider.chat_stream(model, {"messages": [{"role": "user", "content": "a b c d e"}]})
            with pytest.raises(ProviderError) as err:
                async for _ in stream:
                    got += 1
            assert err.value.message.startswith("anthropic: ") and err.value.status >= 500
            return got

        assert run(go()) >= 2


# -- timeouts, probing, the model list -----------------------------------------------------------------
def test_a_hanging_provider_times_out_at_the_configured_time(tmp_path: Any, ollama_standin: Any, anthropic_standin: Any) -> None:
    reg = make_registry(tmp_path, ollama_standin.state.url, anthropic_standin.state.url, provider_timeout_s=1.0)
    for name in ("ollama:slow-hang:1b", "anthropic:claude-hang"):
        provider, model = reg.route(name)  # type: ignore[misc]
        started = time.monotonic()
        with pytest.raises(ProviderTimeout) as err:
            run(provider.chat(model, {"messages": [{"role": "user", "content": "x"}]}))
        elapsed = time.monotonic() - started
        assert err.value.status == 504 and 0.9 < elapsed < 4.0, (name, elapsed)


def test_probe_validate_and_status(registry: ProviderRegistry) -> None:
    async def go() -> tuple[Any, ...]:
        before = registry.status_map()
        await registry.probe_all()
        return before, registry.status_map(), registry.listing(), await registry.validate("ollama")

    before, after, listed, valid = run(go())
    assert before["ollama"] == "configured" and before["local"] == "connected"
    assert after["ollama"] == "connected" and after["anthropic"] == "connected" and after["openai"] == "configured"
    status = {p["id"]: p["status"] for p in listed}
    assert status["ollama"] == "available" and status["openai"] == "unavailable"
    assert valid["valid"] is True and valid["models_available"] == len(standins.OLLAMA_MODELS)
    assert valid["latency_ms"] >= 0
    with pytest.raises(UnknownProvider):
        run(registry.validate("nope"))
    openai_result = run(registry.validate("openai"))
    assert openai_result["valid"] is False and "OPENAI_API_KEY" in openai_result["error"]


def test_model_list_stays_fast_while_a_provider_is_down(tmp_path: Any, anthropic_standin: Any) -> None:
    with standins.silent_server() as hung:
        reg = make_registry(tmp_path, hung, anthropic_standin.state.url)

        async def go() -> tuple[list[Any], float, list[Any], float, dict[str, Any]]:
            t0 = time.monotonic()
            first = await reg.models()
            t1 = time.monotonic()
            second = await reg.models()
            t2 = time.monotonic()
            valid = await reg.validate("ollama")
            await reg.close()
            return first, t1 - t0, second, t2 - t1, valid

        first, first_s, second, second_s, valid = run(go())
    assert first_s < 1.5 and second_s < 0.1  # bounded by the probe timeout, then cached
    assert {m["id"] for m in first} == {f"anthropic:{m}" for m in standins.ANTHROPIC_MODELS}
    assert all(m["owned_by"] == "anthropic" for m in first) and first == second
    assert valid["valid"] is False and "ollama" in valid["error"]


def test_a_provider_that_is_down_is_a_502(tmp_path: Any, anthropic_standin: Any) -> None:
    reg = make_registry(tmp_path, standins.closed_port_url(), anthropic_standin.state.url)
    provider, model = reg.route("ollama:qwen2.5:7b")  # type: ignore[misc]
    with pytest.raises(ProviderUnreachable) as err:
        run(provider.chat(model, {"messages": [{"role": "user", "content": "x"}]}))
    assert err.value.status == 502 and err.value.message.startswith("ollama: cannot reach")
