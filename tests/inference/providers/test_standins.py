"""The stand-ins speak their vendor's protocol: proven here with the official clients
(``ollama``, ``anthropic``) before conch's providers are tested against them."""

from __future__ import annotations

from typing import Any

import anthropic
import ollama
import pytest

from tests.inference.providers.standins import ANTHROPIC_KEY


# -- Ollama ------------------------------------------------------------------------------------
def test_ollama_client_lists_chats_streams_and_embeds(ollama_standin: Any) -> None:
    client = ollama.Client(host=ollama_standin.state.url)
    names = [m.model for m in client.list().models]
    assert "qwen2.5:7b" in names

    reply = client.chat(model="qwen2.5:7b", messages=[{"role": "user", "content": "hi there"}])
    assert reply.message.content == "echo: hi there"
    assert reply.done and reply.done_reason == "stop" and reply.eval_count

    parts = list(client.chat(model="qwen2.5:7b", messages=[{"role": "user", "content": "a b c"}], stream=True))
    assert "".join(p.message.content for p in parts) == "echo: a b c"
    assert parts[-1].done and not parts[0].done

    tools = [{"type": "function", "function": {"name": "weather", "description": "w",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    called = client.chat(model="qwen2.5:7b", messages=[{"role": "user", "content": "weather?"}], tools=tools)
    assert called.message.tool_calls[0].function.name == "weather"
    assert called.message.tool_calls[0].function.arguments == {"city": "Paris"}

    vectors = client.embed(model="nomic-embed-text:latest", input=["a", "b"])
    assert len(vectors.embeddings) == 2 and len(vectors.embeddings[0]) == 8


def test_ollama_client_sees_unknown_model_as_404(ollama_standin: Any) -> None:
    client = ollama.Client(host=ollama_standin.state.url)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="nope:1b", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 404 and "not found" in err.value.error


# -- Anthropic ----------------------------------------------------------------------------------
def _client(app: Any, key: str = ANTHROPIC_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=app.state.url, max_retries=0)


def test_anthropic_client_messages_and_models(anthropic_standin: Any) -> None:
    client = _client(anthropic_standin)
    assert "claude-test-1" in [m.id for m in client.models.list()]
    msg = client.messages.create(model="claude-test-1", max_tokens=50, system="be brief",
                                 messages=[{"role": "user", "content": "hello"}])
    assert msg.content[0].text == "[be brief] echo: hello"
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens > 0


def test_anthropic_client_streams_text_and_tool_use(anthropic_standin: Any) -> None:
    client = _client(anthropic_standin)
    with client.messages.stream(model="claude-test-1", max_tokens=50,
                                messages=[{"role": "user", "content": "one two three"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "echo: one two three" and final.stop_reason == "end_turn"

    tools = [{"name": "weather", "description": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    with client.messages.stream(model="claude-test-1", max_tokens=50, tools=tools,
                                messages=[{"role": "user", "content": "weather?"}]) as stream:
        final = stream.get_final_message()
    use = next(b for b in final.content if b.type == "tool_use")
    assert use.name == "weather" and use.input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_anthropic_client_errors(anthropic_standin: Any) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        _client(anthropic_standin, key="wrong").messages.create(
            model="claude-test-1", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        _client(anthropic_standin).messages.create(
            model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.APIStatusError) as err:  # the error event of an overloaded stream
        for _ in _client(anthropic_standin).messages.create(
                model="claude-overloaded", max_tokens=50, stream=True,
                messages=[{"role": "user", "content": "a b c d e"}]):
            pass
    assert "Overloaded" in str(err.value)
