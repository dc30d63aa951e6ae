"""Chat domain logic without a model: message rendering, grammars, tool-call parsing."""

from __future__ import annotations

import json

import pytest

from conch.inference.engines.base import ChatInputError, ChatSpec, SamplingParams, ToolSpec
from conch.inference.engines.llama.grammar import plan_constraints
from conch.inference.engines.tool_calls import content_text, parse_tool_calls, render_messages

WEATHER = ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def test_content_parts() -> None:
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "c") == "ab"
    assert content_text(None, "c") == ""
    with pytest.raises(ChatInputError) as exc:
        content_text([{"type": "image_url", "image_url": {"url": "x"}}], "messages[0].content")
    assert exc.value.param == "messages[0].content[0].type"


def test_tool_messages_render_as_text() -> None:
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "3C", "tool_call_id": "1"},
    ]
    out = render_messages(msgs, [WEATHER], inject_tools=True)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in out[2]["content"]
    assert out[3] == {"role": "user", "content": "<tool_response>\n3C\n</tool_response>"}


def test_parse_tool_calls() -> None:
    content, calls = parse_tool_calls('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', [WEATHER])
    assert content == "Sure."
    assert calls[0]["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Rome"})}
    assert calls[0]["id"].startswith("call_")
    text, none = parse_tool_calls('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>', [WEATHER])
    assert none == [] and text.startswith("<tool_call>")
    assert parse_tool_calls("plain answer", [WEATHER]) == ("plain answer", [])


def test_grammars_planned() -> None:
    forced = ChatSpec(messages=[], sampling=SamplingParams(), tools=[WEATHER], tool_choice="required")
    plan_constraints(forced)
    assert forced.sampling.grammar and forced.sampling.grammar.startswith('root ::= "<tool_call>" call')
    assert not forced.sampling.grammar_triggers
    auto = ChatSpec(messages=[], sampling=SamplingParams(), tools=[WEATHER], tool_choice="auto")
    plan_constraints(auto)
    assert auto.sampling.grammar_triggers
    schema = ChatSpec(messages=[], sampling=SamplingParams(), response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})
    plan_constraints(schema)
    assert schema.sampling.grammar and "root ::=" in schema.sampling.grammar
    unknown = ChatSpec(messages=[], sampling=SamplingParams(), tools=[WEATHER], tool_choice="function", named_tool="nope")
    with pytest.raises(ChatInputError) as exc:
        plan_constraints(unknown)
    assert exc.value.param == "tool_choice"
