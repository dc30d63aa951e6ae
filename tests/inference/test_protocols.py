"""The translations between other vendors' APIs and conch's OpenAI chat shapes, checked against
the vendors' own types (openai.types.responses, anthropic.types, ollama's types) field by field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from ollama import (
    ChatResponse,
    EmbedResponse,
    GenerateResponse,
    ListResponse,
    ProcessResponse,
    ShowResponse,
)
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conch.inference.api import anthropic as a
from conch.inference.api import ollama as o
from conch.inference.api import responses as r
from conch.inference.api.dialect import TranslationError
from conch.inference.api.openai import ChatCompletionRequest
from conch.inference.models.store import ModelRecord
from tests.vendor_shapes import strict


def completion(content: str | None = "Hello there", tool_calls: list[dict[str, Any]] | None = None,
               finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc123", "object": "chat.completion", "created": 1_700_000_000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                     "finish_reason": finish, "logprobs": None, **choice}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    return {"id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, "usage": usage}


TEXT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, "stop"),
    chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
]
TOOL_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me check."}),
    chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}),
    chunk({}, "tool_calls"),
    chunk(None, usage={"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}),
]


def chat_valid(body: dict[str, Any]) -> ChatCompletionRequest:
    req = ChatCompletionRequest.model_validate(body)
    for m in body["messages"]:
        TypeAdapter(ChatCompletionMessageParam).validate_python(m)
    return req


# -- Anthropic ---------------------------------------------------------------------------------
def test_anthropic_request_system_multi_turn_tools() -> None:
    body = {
        "model": "smol", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5, "metadata": {"user_id": "u"},
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
                                         {"type": "text", "text": "Thanks"}]},
        ],
    }
    chat = a.messages_to_chat(body)
    req = chat_valid(chat)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][0]["content"] == "Be brief."
    assert chat["messages"][2] == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "21C"}
    assert (req.max_tokens, req.stop, req.temperature) == (64, ["END"], 0.2)
    assert chat["top_k"] == 5
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["tools"][0]["function"]["parameters"]["properties"]["city"] == {"type": "string"}
    assert a.messages_to_chat({**body, "tool_choice": {"type": "tool", "name": "get_weather"}})["tool_choice"] == {
        "type": "function", "function": {"name": "get_weather"}}
    assert a.messages_to_chat({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})["temperature"] == 1.0


@pytest.mark.parametrize(("patch", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
])
def test_anthropic_request_refusals_name_the_field(patch: dict[str, Any], param: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **patch}
    with pytest.raises(TranslationError) as info:
        a.messages_to_chat(body)
    assert info.value.param == param


def test_anthropic_message_text_and_tool_use() -> None:
    msg = a.chat_to_message(completion(), "smol")
    m = strict(Message, msg)
    assert m.content[0].type == "text" and m.content[0].text == "Hello there"  # type: ignore[union-attr]
    assert (m.stop_reason, m.stop_sequence, m.usage.input_tokens, m.usage.output_tokens) == ("end_turn", None, 12, 5)
    assert m.id.startswith("msg_") and m.model == "smol"
    tool = strict(Message, a.chat_to_message(completion(None, [CALL], "tool_calls"), "smol"))
    assert tool.stop_reason == "tool_use"
    block = tool.content[0]
    assert block.type == "tool_use" and block.input == {"city": "Paris"} and block.id == "call_1"  # type: ignore[union-attr]
    assert strict(Message, a.chat_to_message(completion(finish="length"))).stop_reason == "max_tokens"
    stopped = strict(Message, a.chat_to_message(completion(stop_reason="END")))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")


def _anthropic_events(stream: list[dict[str, Any]]) -> list[Any]:
    t = a.MessageStream("smol", msg_id="msg_1")
    events = t.start()
    for c in stream:
        events += t.feed(c)
    events += t.finish()
    out = []
    for name, data in events:
        ev = strict(RawMessageStreamEvent, data) if name != "ping" else data
        assert name == data["type"]
        out.append(ev)
    return out


def test_anthropic_stream_text() -> None:
    evs = _anthropic_events(TEXT_STREAM)
    kinds = [e["type"] if isinstance(e, dict) else e.type for e in evs]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e.delta.text for e in evs if getattr(e, "type", "") == "content_block_delta") == "Hello"
    assert evs[-2].delta.stop_reason == "end_turn" and evs[-2].usage.output_tokens == 2


def test_anthropic_stream_tool_use_input_json_delta() -> None:
    evs = _anthropic_events(TOOL_STREAM)
    starts = [e for e in evs if getattr(e, "type", "") == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["text", "tool_use"] and [s.index for s in starts] == [0, 1]
    assert starts[1].content_block.name == "get_weather" and starts[1].content_block.id == "call_1"
    partial = "".join(e.delta.partial_json for e in evs if getattr(e, "type", "") == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert [e.index for e in evs if getattr(e, "type", "") == "content_block_stop"] == [0, 1]
    assert evs[-2].delta.stop_reason == "tool_use" and evs[-2].usage.input_tokens == 30


def test_anthropic_error_shape() -> None:
    from anthropic.types import ErrorResponse

    assert strict(ErrorResponse, a.error_body(400, "bad")).error.type == "invalid_request_error"
    assert strict(ErrorResponse, a.error_body(404, "no")).error.type == "not_found_error"
    assert strict(ErrorResponse, a.error_body(429, "busy")).error.type == "rate_limit_error"
    assert strict(ErrorResponse, a.error_body(500, "oops")).error.type == "api_error"


# -- Responses ---------------------------------------------------------------------------------
def test_responses_request_items_tools_format() -> None:
    body = {
        "model": "smol", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.3, "store": False,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}, "strict": True}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
    }
    chat = r.responses_to_chat(body)
    req = chat_valid(chat)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["content"] == "Checking." and chat["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert req.max_tokens == 50 and req.temperature == 0.3
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}}
    assert r.responses_to_chat({"model": "m", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("patch", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0].arguments"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"include": ["file_search_call.results"]}, "include"),
])
def test_responses_refusals_name_the_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as info:
        r.responses_to_chat({"model": "m", "input": "x", **patch})
    assert info.value.param == param


def test_responses_object_text_tool_incomplete() -> None:
    body = {"model": "smol", "input": "hi", "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    resp = strict(Response, r.chat_to_response(completion(), body))
    assert resp.status == "completed" and resp.output_text == "Hello there" and resp.id.startswith("resp_")
    assert resp.usage is not None and (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (12, 5, 17)
    calls = strict(Response, r.chat_to_response(completion(None, [CALL], "tool_calls"), body))
    item = calls.output[0]
    assert item.type == "function_call" and item.call_id == "call_1" and json.loads(item.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    cut = strict(Response, r.chat_to_response(completion(finish="length"), body))
    assert cut.status == "incomplete" and cut.incomplete_details is not None and cut.incomplete_details.reason == "max_output_tokens"


def _response_events(stream: list[dict[str, Any]]) -> list[Any]:
    t = r.ResponseStream({"model": "smol", "input": "hi"})
    events = t.start()
    for c in stream:
        events += t.feed(c)
    events += t.finish()
    parsed = [strict(ResponseStreamEvent, e) for e in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    return parsed


def test_responses_stream_text_events() -> None:
    evs = _response_events(TEXT_STREAM)
    assert [e.type for e in evs] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert evs[6].text == "Hello"
    done = evs[-1].response
    assert done.output_text == "Hello" and done.usage.output_tokens == 2 and done.status == "completed"


def test_responses_stream_function_call_events() -> None:
    evs = _response_events(TOOL_STREAM)
    kinds = [e.type for e in evs]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    args_done = next(e for e in evs if e.type == "response.function_call_arguments.done")
    assert json.loads(args_done.arguments) == {"city": "Paris"} and args_done.output_index == 1
    final = evs[-1].response
    assert [o.type for o in final.output] == ["message", "function_call"]


# -- Ollama ------------------------------------------------------------------------------------
def test_ollama_chat_request_options_format_tools() -> None:
    body = {
        "model": "smol", "format": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "options": {"temperature": 0, "num_predict": 20, "stop": ["\n"], "seed": 7, "num_ctx": 1024, "top_p": 0.9,
                    "top_k": 20, "repeat_penalty": 1.1, "num_thread": 2, "unknown_thing": 1},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                     {"role": "tool", "content": "ok", "tool_name": "f"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }
    chat = o.chat_request(body, n_ctx=2048)
    req = chat_valid(chat)
    assert (req.temperature, req.max_tokens, req.stop, req.seed, req.top_p) == (0, 20, ["\n"], 7, 0.9)
    assert chat["top_k"] == 20 and chat["repeat_penalty"] == 1.1 and "num_thread" not in chat
    assert chat["response_format"]["json_schema"]["schema"]["properties"]["a"] == {"type": "integer"}
    assert json.loads(chat["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}
    assert o.chat_request({"model": "m", "messages": [], "format": "json"})["response_format"] == {"type": "json_object"}
    assert o.chat_request({"model": "m", "messages": []})["temperature"] == 0.8


@pytest.mark.parametrize(("options", "param"), [
    ({"num_ctx": 99999}, "options.num_ctx"), ({"mirostat": 2}, "options.mirostat"), ({"num_predict": 0}, "options.num_predict"),
])
def test_ollama_options_refused(options: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as info:
        o.chat_request({"model": "m", "messages": [], "options": options}, n_ctx=2048)
    assert info.value.param == param


def test_ollama_generate_request_kinds() -> None:
    kind, chat = o.generate_request({"model": "m", "prompt": "hi", "system": "sys"})
    assert kind == "chat" and chat["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    kind, comp = o.generate_request({"model": "m", "prompt": "def f(", "suffix": "return 1", "options": {"num_predict": 5}})
    assert kind == "completion" and comp["prompt"] == "def f(" and comp["suffix"] == "return 1" and comp["max_tokens"] == 5
    # Images go with the chat template (issue 34: images in chat); a raw prompt cannot carry them.
    with pytest.raises(TranslationError):
        o.generate_request({"model": "m", "prompt": "x", "images": ["abc"], "raw": True})
    kind, chat = o.generate_request({"model": "m", "prompt": "x", "images": ["abc"]})
    assert kind == "chat" and chat["messages"][0]["content"][0]["image_url"]["url"] == "data:image/*;base64,abc"


def test_ollama_chat_and_generate_objects() -> None:
    s = o.OllamaStream("smol", "chat")
    lines = [obj for c in TOOL_STREAM for obj in s.feed(c)]
    for line in lines:
        assert strict(ChatResponse, line).done is False
    final = strict(ChatResponse, s.final(total_ns=10, prompt_ns=3, eval_ns=7, collected=True))
    assert final.done and final.done_reason == "stop" and final.message.content == "Let me check."
    assert final.message.tool_calls is not None and final.message.tool_calls[0].function.arguments == {"city": "Paris"}
    assert (final.prompt_eval_count, final.eval_count) == (30, 12)
    g = o.OllamaStream("smol", "generate")
    text = "".join(strict(GenerateResponse, x).response or "" for c in TEXT_STREAM for x in g.feed(c))
    assert text == "Hello"
    assert strict(GenerateResponse, g.final(total_ns=5)).done_reason == "stop"


def test_ollama_model_objects() -> None:
    rec = ModelRecord(id="smol", path="/x/smol.gguf", size_bytes=100, sha256="ab" * 32, architecture="llama",
                      context_length=8192, quantization="q4_1", capabilities=["chat", "embeddings"])
    tags = strict(ListResponse, {"models": [o.tag_entry(rec)]}, allow=["models[].name"])
    assert tags.models[0].model == "smol" and tags.models[0].details.quantization_level == "Q4_1"
    ps = strict(ProcessResponse, {"models": [o.ps_entry(rec, 1_900_000_000.0)]})
    assert ps.models[0].context_length == 8192
    show = strict(ShowResponse, o.show_entry(rec, template="{{ x }}"))
    assert show.capabilities == ["completion", "embedding"] and show.modelinfo["llama.context_length"] == 8192
    emb = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}], "model": "e",
           "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    assert strict(EmbedResponse, o.embed_response("e", emb, 10)).embeddings == [[0.6, 0.8]]


# -- legacy completions ------------------------------------------------------------------------
def test_completions_request_forms_and_refusals() -> None:
    from conch.inference.api import completions as c

    assert c.prompts(c.CompletionRequest(model="m", prompt="hi")) == ["hi"]
    assert c.prompts(c.CompletionRequest(model="m", prompt=["a", "b"])) == ["a", "b"]
    assert c.prompts(c.CompletionRequest(model="m", prompt=[1, 2, 3])) == [[1, 2, 3]]
    assert c.prompts(c.CompletionRequest(model="m", prompt=[[1, 2], [3]])) == [[1, 2], [3]]
    assert c.CompletionRequest(model="m", prompt="x").max_tokens == 16
    for bad, param in (({"best_of": 3}, "best_of"), ({"echo": True, "logprobs": 2}, "echo"), ({"stop": list("abcde")}, "stop")):
        with pytest.raises(TranslationError) as info:
            c.check(c.CompletionRequest(model="m", prompt="x", **bad))
        assert info.value.param == param
    assert c.logit_bias(c.CompletionRequest(model="m", prompt="x", logit_bias={"5": -100}), 10) == {5: -100.0}
    for bias in ({"x": 1}, {"10": 1}, {"1": 101}):
        with pytest.raises(TranslationError):
            c.logit_bias(c.CompletionRequest(model="m", prompt="x", logit_bias=bias), 10)


def test_completion_objects_match_openai_types() -> None:
    from openai.types import Completion

    from conch.inference.api import completions as c

    entries = [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108], "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]}]},
               {"token": "lo", "logprob": -0.1, "bytes": [108, 111], "top_logprobs": []}]
    lp = c.legacy_logprobs(entries, 4)
    assert lp["text_offset"] == [4, 7] and lp["top_logprobs"][0] == {"Hel": -0.5}
    obj = c.completion("cmpl-1", "m", [c.choice(0, "Hello", "stop", lp)], c.usage(3, 2))
    done = strict(Completion, obj)
    assert done.choices[0].logprobs is not None and done.choices[0].logprobs.tokens == ["Hel", "lo"]
    assert done.usage is not None and done.usage.total_tokens == 5
    # A stream chunk: OpenAI sends ``finish_reason: null`` until the last one (its SDK type
    # only lists the final values, so the final chunk is what is checked here).
    strict(Completion, c.completion("cmpl-1", "m", [c.choice(0, "", "length", None)], None))  # type: ignore[arg-type]
