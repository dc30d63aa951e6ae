"""Every API conch serves, through its vendor's official Python client, against the real server
and the real SmolLM2 model: OpenAI (Responses), Anthropic (Messages, count_tokens) and Ollama
(chat, generate, embed, tags, show, ps, pull, delete). Objects and events are checked against
the vendors' own types field by field (tests/vendor_shapes.py)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from conch.inference.models.bundled import find_bundled_gguf
from tests.vendor_shapes import strict
from tests.web.conftest import RunningServer

MODEL = "smollm2-135m-instruct"
# This anthropic SDK no longer takes sampling arguments; older ones (and raw clients) send them.
GREEDY = {"temperature": 0}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _anthropic(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="anything", max_retries=0, timeout=120)


def _ollama(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


# -- OpenAI Responses ----------------------------------------------------------------------------
def test_responses_plain(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    resp = client.responses.create(model=MODEL, input="Name three colours.", instructions="Answer briefly.",
                                   max_output_tokens=16, temperature=0)
    strict(Response, resp.model_dump(mode="json", exclude_unset=True))
    assert resp.status in ("completed", "incomplete") and resp.output_text.strip()
    assert resp.usage is not None and 0 < resp.usage.output_tokens <= 16


def test_responses_stream(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=12, temperature=0, stream=True))
    for ev in events:
        strict(ResponseStreamEvent, ev.model_dump(mode="json", exclude_unset=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_tools_and_function_call_output(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    tools: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                         "parameters": WEATHER_SCHEMA, "strict": True}]
    resp = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools,
                                   tool_choice="required", max_output_tokens=64, temperature=0)
    strict(Response, resp.model_dump(mode="json", exclude_unset=True))
    call = next(o for o in resp.output if o.type == "function_call")
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    # The stateless way to continue: send the call and its output back as input items.
    follow = client.responses.create(model=MODEL, tools=tools, max_output_tokens=24, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees and sunny"},
    ])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_responses_stream_function_call(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    tools: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}]
    events = list(client.responses.create(model=MODEL, input="Weather in Rome?", tools=tools, tool_choice="required",
                                          max_output_tokens=64, temperature=0, stream=True))
    for ev in events:
        strict(ResponseStreamEvent, ev.model_dump(mode="json", exclude_unset=True))
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "city" in json.loads(done.arguments)
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == done.arguments


def test_responses_json_schema(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"], "additionalProperties": False}
    resp = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=40, temperature=0,
                                   text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    assert isinstance(json.loads(resp.output_text)["colour"], str)


def test_responses_previous_response_id_is_a_clear_400(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "does not store responses" in info.value.body["message"]  # type: ignore[index]


# -- Anthropic Messages ------------------------------------------------------------------------
def test_messages_plain(inference_server: RunningServer) -> None:
    msg = _anthropic(inference_server).messages.create(
        model=MODEL, max_tokens=16, system="Answer briefly.", extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                  {"role": "user", "content": "Another one?"}])
    strict(Message, msg.model_dump(mode="json", exclude_unset=True))
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and 0 < msg.usage.output_tokens <= 16


def test_messages_stop_sequence(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    free = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": "Count from 1 to 10."}])
    text = free.content[0].text  # type: ignore[union-attr]
    word = next(w for w in text.split() if len(w) > 1)
    stopped = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, stop_sequences=[word],
                                     messages=[{"role": "user", "content": "Count from 1 to 10."}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word


def test_messages_stream(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    with client.messages.stream(model=MODEL, max_tokens=16, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        raw = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in raw]
    assert kinds[0] == "message_start" and "content_block_delta" in kinds and kinds[-1] == "message_stop"
    # As Anthropic does, message_start already reports the prompt's tokens (clients such as
    # LangChain read input tokens there and output tokens from message_delta).
    start = raw[0].message.usage  # type: ignore[union-attr]
    assert start.input_tokens > 0 and start.input_tokens == final.usage.input_tokens
    text = "".join(e.delta.text for e in raw if e.type == "content_block_delta" and e.delta.type == "text_delta")  # type: ignore[union-attr]
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    # The raw events, as they arrived, against Anthropic's own event types.
    with httpx.Client(base_url=inference_server.url, timeout=120) as c, c.stream(
        "POST", "/v1/messages", headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ) as resp:
        assert resp.status_code == 200
        names, datas = [], []
        for line in resp.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                datas.append(json.loads(line[6:]))
    assert len(names) == len(datas)
    for name, data in zip(names, datas, strict=True):
        assert data["type"] == name
        if name != "ping":
            strict(RawMessageStreamEvent, data)


def test_messages_tools_round_trip(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    tools: list[Any] = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER_SCHEMA}]
    msg = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, tools=tools, tool_choice={"type": "any"},
                                 messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    strict(Message, msg.model_dump(mode="json", exclude_unset=True))
    use = next(b for b in msg.content if b.type == "tool_use")
    assert msg.stop_reason == "tool_use" and use.name == "get_weather" and isinstance(use.input["city"], str)  # type: ignore[union-attr, index]
    follow = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, tools=tools, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},  # type: ignore[misc]
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 degrees"}]},  # type: ignore[union-attr]
    ])
    assert follow.content


def test_messages_stream_tool_use(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    tools: list[Any] = [{"name": "get_weather", "input_schema": WEATHER_SCHEMA}]
    with client.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, tools=tools, tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather in Rome?"}]) as stream:
        final = stream.get_final_message()
    use = next(b for b in final.content if b.type == "tool_use")
    assert final.stop_reason == "tool_use" and "city" in use.input  # type: ignore[union-attr, operator]


def test_messages_output_config_json_schema(inference_server: RunningServer) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"], "additionalProperties": False}
    msg = _anthropic(inference_server).messages.create(
        model=MODEL, max_tokens=40, extra_body=GREEDY, output_config={"format": {"type": "json_schema", "schema": schema}},
        messages=[{"role": "user", "content": "Name a colour."}])
    assert isinstance(json.loads(msg.content[0].text)["colour"], str)  # type: ignore[union-attr]


def test_count_tokens(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    short = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    long = client.messages.count_tokens(model=MODEL, system="Be brief.",
                                        messages=[{"role": "user", "content": "Hi " * 50}])
    assert 0 < short.input_tokens < long.input_tokens
    msg = client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
    assert msg.usage.input_tokens == short.input_tokens


def test_messages_errors_in_anthropic_shape(inference_server: RunningServer) -> None:
    client = _anthropic(inference_server)
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert bad.value.body["type"] == "error" and "messages[0].content[0]" in bad.value.body["error"]["message"]  # type: ignore[index]


# -- Ollama ------------------------------------------------------------------------------------
def test_ollama_chat_plain_stream_format(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    resp = client.chat(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                       options={"temperature": 0, "num_predict": 12, "seed": 1})
    assert resp.done and resp.message.role == "assistant" and resp.message.content
    assert resp.eval_count is not None and 0 < resp.eval_count <= 12 and resp.prompt_eval_count
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], stream=True,
                             options={"temperature": 0, "num_predict": 12}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == resp.message.content
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    js = client.chat(model=MODEL, messages=[{"role": "user", "content": "A colour as JSON."}], format=schema,
                     options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(js.message.content or "")["colour"], str)


def test_ollama_chat_tools(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    tools: list[Any] = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                          "parameters": WEATHER_SCHEMA}}]
    resp = client.chat(model=MODEL, messages=[{"role": "user", "content": "Use the tool: weather in Paris?"}], tools=tools,
                       options={"temperature": 0, "num_predict": 64})
    assert resp.done
    if resp.message.tool_calls:  # "auto": the model may answer in words
        assert resp.message.tool_calls[0].function.name == "get_weather"


def test_ollama_options_refused_and_errors(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "x"}], options={"mirostat": 2})
    assert info.value.status_code == 400 and "options.mirostat" in info.value.error
    with pytest.raises(ollama.ResponseError) as nf:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert nf.value.status_code == 404


def test_ollama_generate(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    resp = client.generate(model=MODEL, prompt="Name a colour.", system="Answer in one word.",
                           options={"temperature": 0, "num_predict": 8})
    assert resp.done and resp.response and resp.done_reason in ("stop", "length")
    parts = list(client.generate(model=MODEL, prompt="Name a colour.", stream=True, options={"temperature": 0, "num_predict": 8}))
    assert parts[-1].done and "".join(p.response for p in parts)
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 4})
    assert raw.response
    loaded = client.generate(model=MODEL, prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_ollama_embed(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    resp = client.embed(model=MODEL, input=["hello", "world"])
    assert len(resp.embeddings) == 2 and len(resp.embeddings[0]) > 10
    assert abs(sum(v * v for v in resp.embeddings[0]) - 1) < 1e-3
    legacy = client.embeddings(model=MODEL, prompt="hello")
    assert legacy.embedding == pytest.approx(resp.embeddings[0], abs=1e-5)


def test_ollama_tags_show_ps_version(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    tags = client.list()
    assert MODEL in [m.model for m in tags.models]
    show = client.show(MODEL)
    assert show.capabilities is not None and "completion" in show.capabilities and show.template
    assert show.modelinfo and show.modelinfo["general.architecture"] == "llama"
    client.generate(model=MODEL, prompt="")
    assert MODEL in [m.model for m in client.ps().models]
    with httpx.Client(base_url=inference_server.url) as c:
        assert c.get("/api/version").json()["version"]


def test_ollama_pull_with_progress_and_delete(inference_server: RunningServer) -> None:
    path = find_bundled_gguf()
    assert path is not None
    with httpx.Client(base_url=inference_server.url, timeout=120) as c, c.stream(
        "POST", "/api/pull", json={"model": "pulled-smol", "source": "file", "path": str(path)}
    ) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in resp.iter_lines() if line]
    for ev in events:
        strict(ollama.ProgressResponse, ev)
    assert events[-1] == {"status": "success"}
    assert any(ev.get("total") for ev in events)
    client = _ollama(inference_server)
    assert "pulled-smol" in [m.model for m in client.list().models]
    out = client.generate(model="pulled-smol", prompt="Hi", options={"num_predict": 2})
    assert out.done
    assert client.delete("pulled-smol").status == "success"
    with pytest.raises(ollama.ResponseError) as gone:
        client.delete("pulled-smol")
    assert gone.value.status_code == 404
