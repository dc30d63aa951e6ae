"""Chat completions against the real server and the real SmolLM2 model, through the official
``openai`` client and raw HTTP; every response and chunk is checked against OpenAI's shapes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from httpx_sse import connect_sse

from tests.web.conftest import RunningServer, start_server
from tests.web.openai_shapes import CHAT_CHUNK, CHAT_COMPLETION, check, check_error

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name three colours."}]


def _chat(server: RunningServer, **body: Any) -> httpx.Response:
    with server.client() as c:
        return c.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, **body})


def _stream_chunks(server: RunningServer, **body: Any) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    with server.client() as c, connect_sse(
        c, "POST", "/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "stream": True, **body}
    ) as events:
        assert events.response.status_code == 200
        assert events.response.headers["content-type"].startswith("text/event-stream")
        done = False
        for sse in events.iter_sse():
            assert sse.event == "message"  # no `event:` line
            if sse.data == "[DONE]":
                done = True
                break
            chunk = json.loads(sse.data)
            check(chunk, CHAT_CHUNK)
            chunks.append(chunk)
        assert done, "stream must end with data: [DONE]"
    return chunks


def test_plain_completion_with_the_openai_client(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    body = out.model_dump()
    check(body, CHAT_COMPLETION)
    assert out.id.startswith("chatcmpl-")
    assert out.object == "chat.completion"
    assert out.model == MODEL
    assert abs(out.created - time.time()) < 600
    choice = out.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None
    assert out.usage.prompt_tokens > 0 and 0 < out.usage.completion_tokens <= 16
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_streamed_completion_with_the_openai_client(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for ch in chunks:
        check(ch.model_dump(), CHAT_CHUNK)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert all(c.model == MODEL and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens <= 12

    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert text == plain.choices[0].message.content


def test_stream_wire_format(inference_server: RunningServer) -> None:
    chunks = _stream_chunks(inference_server, max_tokens=6, temperature=0)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content, "content deltas expected"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c or c["usage"] is None for c in chunks)


def test_streaming_is_incremental(inference_server: RunningServer) -> None:
    """Content reaches the client while the model is still generating, token by token."""
    story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    before = _metric(inference_server, "conch_inference_generated_tokens_total")
    with inference_server.client() as c, connect_sse(
        c, "POST", "/v1/chat/completions",
        json={"model": MODEL, "messages": story, "stream": True, "max_tokens": 200, "temperature": 0,
              "stream_options": {"include_usage": True}},
    ) as events:
        it = events.iter_sse()
        contents = 0
        for sse in it:
            chunk = json.loads(sse.data)
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                contents += 1
                if contents == 2:
                    break
        produced_so_far = _metric(inference_server, "conch_inference_generated_tokens_total") - before
        rest = [json.loads(s.data) for s in it if s.data != "[DONE]"]
    total = rest[-1]["usage"]["completion_tokens"]
    assert total > 50
    # A server that buffered the answer would have generated all of it before the first chunk.
    assert produced_so_far < total
    assert sum(1 for c in rest if c["choices"] and c["choices"][0]["delta"].get("content")) > 20


def test_same_seed_reproduces(inference_server: RunningServer) -> None:
    a = _chat(inference_server, max_tokens=20, temperature=0, seed=7).json()
    b = _chat(inference_server, max_tokens=20, temperature=0, seed=7).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    c = _chat(inference_server, max_tokens=20, temperature=0.9, seed=123).json()
    d = _chat(inference_server, max_tokens=20, temperature=0.9, seed=123).json()
    assert c["choices"][0]["message"]["content"] == d["choices"][0]["message"]["content"]


def test_n_choices(inference_server: RunningServer) -> None:
    body = _chat(inference_server, max_tokens=8, n=3, temperature=0.8, seed=1).json()
    check(body, CHAT_COMPLETION)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] <= 24
    chunks = _stream_chunks(inference_server, max_tokens=5, n=2)
    finals = {c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finals == {0, 1}


def test_max_tokens_gives_length(inference_server: RunningServer) -> None:
    body = _chat(inference_server, max_tokens=3, temperature=0).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def test_stop_sequence(inference_server: RunningServer) -> None:
    full = _chat(inference_server, max_tokens=30, temperature=0).json()["choices"][0]["message"]["content"]
    words = full.split()
    assert len(words) > 3
    stop = words[2]
    body = _chat(inference_server, max_tokens=30, temperature=0, stop=[stop]).json()
    text = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert stop not in text and full.startswith(text)
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in _stream_chunks(inference_server, max_tokens=30, temperature=0, stop=stop)
        if c["choices"]
    )
    assert streamed == text


def test_content_as_text_parts(inference_server: RunningServer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colours."}]}]
    a = _chat(inference_server, messages=parts, max_tokens=8, temperature=0).json()
    b = _chat(inference_server, max_tokens=8, temperature=0).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_json_schema_output_validates(inference_server: RunningServer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "colour": {"type": "string", "enum": ["red", "green", "blue"]},
            "count": {"type": "integer"},
            "bright": {"type": "boolean"},
        },
        "required": ["colour", "count", "bright"],
        "additionalProperties": False,
    }
    client = inference_server.openai()
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a colour as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "colour", "schema": schema, "strict": True}},
    )
    value = json.loads(out.choices[0].message.content or "")
    jsonschema.validate(value, schema)


def test_json_object_output_parses(inference_server: RunningServer) -> None:
    body = _chat(
        inference_server, max_tokens=80, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Reply with a JSON object with a key name."}],
    ).json()
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def test_forced_tool_call_parses(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    check(out.model_dump(), CHAT_COMPLETION)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])  # type: ignore[index]


def test_required_tool_call_streams(inference_server: RunningServer) -> None:
    chunks = _stream_chunks(
        inference_server,
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0,
    )
    deltas = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert deltas and deltas[0]["function"]["name"] == "get_weather"
    json.loads("".join(d["function"].get("arguments") or "" for d in deltas))
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_answers_text_or_a_valid_call(inference_server: RunningServer, stream: bool) -> None:
    """With tool_choice auto the model chooses; whatever it chooses is well-formed."""
    messages = [{"role": "user", "content": "Call get_weather for Berlin in c."}]
    if stream:
        chunks = _stream_chunks(inference_server, messages=messages, tools=[WEATHER], max_tokens=60, temperature=0)
        reason = chunks[-1]["choices"][0]["finish_reason"]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    else:
        body = _chat(inference_server, messages=messages, tools=[WEATHER], max_tokens=60, temperature=0).json()
        check(body, CHAT_COMPLETION)
        reason = body["choices"][0]["finish_reason"]
        text = body["choices"][0]["message"]["content"] or ""
        calls = body["choices"][0]["message"]["tool_calls"] or []
    assert "<tool_call>" not in text
    if reason == "tool_calls":
        assert calls and calls[0]["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER["function"]["parameters"])  # type: ignore[index]
    else:
        assert reason in ("stop", "length") and not calls and text


def test_tool_round_trip_messages_accepted(inference_server: RunningServer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
    ]
    r = _chat(inference_server, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=20, temperature=0)
    assert r.status_code == 200
    check(r.json(), CHAT_COMPLETION)


# -- errors ----------------------------------------------------------------------------------
def test_unknown_model_is_404(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=HELLO)  # type: ignore[arg-type]
    assert exc.value.code == "model_not_found"
    check_error(_chat(inference_server, model="no-such-model"), 404, "model_not_found", "model")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"n": 0}, "n"),
        ({"stream": "yes please"}, "stream"),
        ({"model": 5}, "model"),
    ],
)
def test_invalid_fields_are_400_naming_the_param(inference_server: RunningServer, body: dict[str, Any], param: str) -> None:
    check_error(_chat(inference_server, **body), 400, param=param)


def test_invalid_request_with_the_openai_client(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=-1)  # type: ignore[arg-type]
    assert exc.value.param == "temperature"


def test_bad_json_and_missing_fields(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        check_error(c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
        check_error(c.post("/v1/chat/completions", json={"model": MODEL}), 400, param="messages")


def test_context_length_exceeded(inference_server: RunningServer) -> None:
    long = "word " * 3000
    r = _chat(inference_server, messages=[{"role": "user", "content": long}], max_tokens=4)
    check_error(r, 400, "context_length_exceeded")
    client = inference_server.openai()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}])
    # and the server keeps serving
    assert _chat(inference_server, max_tokens=2).status_code == 200


def test_remote_provider_without_a_key_is_503(inference_server: RunningServer) -> None:
    # Providers are tested against real servers in tests/inference/providers; here: no key.
    if inference_server.settings.openai_api_key or os.environ.get("OPENAI_API_KEY"):
        pytest.skip("an OpenAI key is configured")
    err = check_error(_chat(inference_server, model="openai:gpt-4o"), 503, "provider_unavailable")
    assert err["message"].startswith("openai: ")


# -- concurrency -------------------------------------------------------------------------------
def _metric(server: RunningServer, name: str) -> float:
    with server.client() as c:
        for line in c.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"metric {name} missing")


def test_disconnect_stops_generation(inference_server: RunningServer) -> None:
    before = _metric(inference_server, "conch_inference_generated_tokens_total")
    with inference_server.client() as c, c.stream(
        "POST", "/v1/chat/completions",
        json={"model": MODEL, "messages": HELLO, "stream": True, "max_tokens": 900, "temperature": 1.0,
              "seed": 3, "stop": ["\u0000never"]},
    ) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 4:
                break
    deadline = time.monotonic() + 30
    while _metric(inference_server, "conch_inference_active_sequences") > 0:
        assert time.monotonic() < deadline, "generation kept running after the client left"
        time.sleep(0.05)
    generated = _metric(inference_server, "conch_inference_generated_tokens_total") - before
    assert generated < 900


def test_health_answers_while_streams_generate(inference_server: RunningServer) -> None:
    started = threading.Barrier(9)
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            with inference_server.client() as c, c.stream(
                "POST", "/v1/chat/completions",
                json={"model": MODEL, "messages": HELLO, "stream": True, "max_tokens": 40, "temperature": 0.7},
            ) as r:
                it = r.iter_lines()
                next(it)
                started.wait(timeout=60)
                for _ in it:
                    pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=stream) for _ in range(8)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    with inference_server.client() as c:
        for _ in range(5):
            r = c.get("/v1/health")
            assert r.status_code == 200 and r.json() == {"status": "ok"}
    for t in threads:
        t.join(timeout=120)
    assert not errors


def test_queue_full_is_429(busy_server: RunningServer) -> None:
    body = {"model": MODEL, "messages": HELLO, "stream": True, "max_tokens": 400, "temperature": 1.0,
            "stop": ["\u0000never"]}
    with busy_server.client() as c1, c1.stream("POST", "/v1/chat/completions", json=body) as first:
        lines = first.iter_lines()
        next(lines)  # generating: the only sequence is taken
        with busy_server.client() as c2, c2.stream("POST", "/v1/chat/completions", json=body) as second:
            assert second.status_code == 200  # queued
            with busy_server.client() as c3:
                r = c3.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
                check_error(r, 429, "queue_full")
                assert r.headers.get("retry-after")
                client = busy_server.openai()
                with pytest.raises(openai.RateLimitError):
                    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    with busy_server.client() as c:
        assert c.get("/v1/health").status_code == 200


def test_speculative_decoding_is_counted(inference_server: RunningServer) -> None:
    """With draft_max = 8 (off by default), a reply that copies its input is drafted by prompt
    lookup: /metrics counts drafted and kept tokens, and the same request gives the same answer
    (the engine tests compare with drafting off token for token on short contexts)."""
    code = "def area(width, height):\n    result = width * height\n    return result\n"
    messages = [{"role": "user", "content": f"Repeat this code exactly:\n\n{code}"}]
    drafted = _metric(inference_server, "conch_inference_draft_tokens_total")
    kept = _metric(inference_server, "conch_inference_draft_accepted_tokens_total")
    client = inference_server.openai()
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0)  # type: ignore[arg-type]
    assert first.choices[0].message.content
    more_drafted = _metric(inference_server, "conch_inference_draft_tokens_total") - drafted
    more_kept = _metric(inference_server, "conch_inference_draft_accepted_tokens_total") - kept
    assert more_drafted > 0 and 0 < more_kept <= more_drafted
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0)  # type: ignore[arg-type]
    assert again.choices[0].message.content == first.choices[0].message.content


def test_a_long_system_prompt_survives_a_restart(tmp_path: Path) -> None:
    """The prompt cache on disk through the server: a restarted server loads the system
    prompt's KV from <data_dir>/kv-cache (counted in /metrics) and answers the same."""
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: be brief and exact." for i in range(40))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    answers = []
    for run in range(2):
        running, server, thread = start_server(tmp_path / "data", n_parallel=1, n_ctx=1024,
                                               prompt_cache_min_tokens=64)
        try:
            restored = _metric(running, "conch_inference_prompt_cache_restored_tokens_total")
            reply = running.openai().chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0  # type: ignore[arg-type]
            )
            answers.append(reply.choices[0].message.content)
            restored = _metric(running, "conch_inference_prompt_cache_restored_tokens_total") - restored
            if run == 0:
                assert restored == 0
                deadline = time.monotonic() + 30  # saved by a writer thread once the sequence is idle
                while not list((tmp_path / "data" / "kv-cache").rglob("*.kv")):
                    assert time.monotonic() < deadline, "no prompt cache file was written"
                    time.sleep(0.1)
                assert _metric(running, "conch_inference_prompt_cache_saved_tokens_total") >= 64
            else:
                assert restored >= 64
        finally:
            server.should_exit = True
            thread.join(timeout=30)
    assert answers[0] == answers[1]
