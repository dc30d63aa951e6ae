"""The scripted model server speaks the OpenAI chat API: proven with the official client."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from testsupport.scripted_model import ScriptedModel, call, final, native


def test_official_openai_client_reads_scripted_replies(scripted: ScriptedModel) -> None:
    goal = scripted.script("proof of protocol", final("hello"))
    client = openai.OpenAI(base_url=scripted.v1, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": goal}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "action", "schema": {"type": "object"}},
        },
    )
    assert reply.choices[0].message.content == final("hello")
    assert reply.usage is not None and reply.usage.total_tokens == 15
    assert scripted.requests_for(goal)[0]["response_format"]["type"] == "json_schema"


def test_official_openai_client_reads_native_tool_calls(scripted: ScriptedModel) -> None:
    scripted.tool_models.add("scripted-tools")
    goal = scripted.script(
        "proof of native tool calls",
        native(call("append", path="a.log", content="x"), call("sleep", ms=5)),
        "all done",
    )
    client = openai.OpenAI(base_url=scripted.v1, api_key="unused", max_retries=0)
    assert client.models.retrieve("scripted-tools").model_extra == {
        "capabilities": ["chat", "tools"]
    }
    tools: list[Any] = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("append", "sleep")
    ]
    messages: list[Any] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": goal},
    ]
    first = client.chat.completions.create(
        model="scripted-tools", messages=messages, tools=tools, tool_choice="auto"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "append", {"path": "a.log", "content": "x"}),
        ("function", "sleep", {"ms": 5}),
    ]
    assert len({c.id for c in calls}) == 2
    # The calls' results go back as tool messages; the next reply is plain text.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in calls]
    second = client.chat.completions.create(
        model="scripted-tools", messages=messages, tools=tools
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "all done"
    assert not second.choices[0].message.tool_calls
    sent = scripted.requests_for(goal)
    assert sent[0]["tools"] == tools and sent[0]["tool_choice"] == "auto"
    assert [m["role"] for m in sent[1]["messages"]] == [
        "system", "user", "assistant", "tool", "tool"
    ]
    assert sent[1]["messages"][3]["tool_call_id"] == calls[0].id


def test_openai_client_sees_the_tools_refusal(scripted: ScriptedModel) -> None:
    scripted.no_tools.add("scripted-plain")
    client = openai.OpenAI(base_url=scripted.v1, api_key="unused", max_retries=0)
    assert client.models.retrieve("scripted-plain").model_extra == {}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="scripted-plain",
            messages=[{"role": "user", "content": "refused"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    assert info.value.status_code == 400 and info.value.param == "tools"
