"""Fidelity fixes found by real clients, each driven over HTTP through the vendor's official
client against the real server and the real SmolLM2 model: Ollama's logprobs, the status of a
Responses output item cut short, and the Responses error envelope's ``code`` and ``param``."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import ollama
import openai
import pytest
from ollama import ChatResponse, GenerateResponse
from openai.types.responses import Response, ResponseStreamEvent

from tests.vendor_shapes import strict
from tests.web.conftest import RunningServer

MODEL = "smollm2-135m-instruct"
COUNT = "Count from 1 to 20, separated by commas."
GREEDY = {"temperature": 0, "num_predict": 8, "seed": 1}


# Ollama's Go types carry ``bytes``; ollama-python's pydantic types leave it out.
OLLAMA_BYTES = ("logprobs[].bytes", "logprobs[].top_logprobs[].bytes")


def _ollama(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def _same(got: Any, want: Any) -> None:
    """Two runs of entries: the same tokens with the same log-probabilities."""
    got, want = list(got), list(want)
    assert [e.token for e in got] == [e.token for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-5)


def _check_entries(entries: Any, top: int) -> None:
    assert entries
    for e in entries:
        assert e.logprob <= 0
        if top == 0:
            assert e.top_logprobs is None  # Ollama leaves an empty list out
            continue
        alts = e.top_logprobs
        assert len(alts) == top and [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        # Greedy: the chosen token is the likeliest one, with the same log-probability.
        assert alts[0].token == e.token and math.isclose(alts[0].logprob, e.logprob, abs_tol=1e-6)


# -- Ollama: logprobs / top_logprobs ------------------------------------------------------------
def test_ollama_chat_logprobs(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    messages = [{"role": "user", "content": COUNT}]
    resp = client.chat(model=MODEL, messages=messages, logprobs=True, top_logprobs=3, options=GREEDY)
    assert resp.done and resp.logprobs is not None
    _check_entries(resp.logprobs, 3)
    assert len(resp.logprobs) == resp.eval_count
    assert "".join(e.token for e in resp.logprobs) == resp.message.content
    # The very numbers /v1/chat/completions reports for the same request: one engine path.
    chat = inference_server.openai().chat.completions.create(
        model=MODEL, messages=messages, logprobs=True, top_logprobs=3, temperature=0, seed=1, max_tokens=8)  # type: ignore[arg-type]
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    _same(resp.logprobs, chat.choices[0].logprobs.content)
    # Streamed: each object carries its own tokens' entries; together they are the whole answer's.
    parts = list(client.chat(model=MODEL, messages=messages, logprobs=True, top_logprobs=3, options=GREEDY, stream=True))
    assert all(p.logprobs for p in parts[:-1] if p.message.content)
    _same((e for p in parts for e in p.logprobs or []), resp.logprobs)
    # Not asked for: no logprobs at all; top_logprobs alone asks for nothing, as in Ollama.
    assert client.chat(model=MODEL, messages=messages, options=GREEDY).logprobs is None
    assert client.chat(model=MODEL, messages=messages, top_logprobs=3, options=GREEDY).logprobs is None
    plain = client.chat(model=MODEL, messages=messages, logprobs=True, options=GREEDY)
    _check_entries(plain.logprobs, 0)


def test_ollama_generate_logprobs(inference_server: RunningServer) -> None:
    client = _ollama(inference_server)
    resp = client.generate(model=MODEL, prompt=COUNT, logprobs=True, top_logprobs=2, options=GREEDY)
    _check_entries(resp.logprobs, 2)
    assert "".join(e.token for e in resp.logprobs or []) == resp.response
    parts = list(client.generate(model=MODEL, prompt=COUNT, logprobs=True, top_logprobs=2, options=GREEDY, stream=True))
    _same((e for p in parts for e in p.logprobs or []), resp.logprobs or [])
    # A raw prompt skips the chat template (the completion path): the same entries there.
    raw = client.generate(model=MODEL, prompt="1, 2, 3, 4,", raw=True, logprobs=True, top_logprobs=2, options=GREEDY)
    _check_entries(raw.logprobs, 2)
    assert "".join(e.token for e in raw.logprobs or []) == raw.response
    raw_parts = list(client.generate(model=MODEL, prompt="1, 2, 3, 4,", raw=True, logprobs=True, top_logprobs=2,
                                     options=GREEDY, stream=True))
    _same((e for p in raw_parts for e in p.logprobs or []), raw.logprobs or [])


def test_ollama_logprobs_wire_shape_and_range(inference_server: RunningServer) -> None:
    """The NDJSON as Ollama writes it: top-level ``logprobs`` with ``bytes`` (UTF-8 of the token)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": COUNT}], "logprobs": True, "top_logprobs": 2,
            "options": GREEDY}
    with httpx.Client(base_url=inference_server.url, timeout=120) as c:
        with c.stream("POST", "/api/chat", json=body) as stream:
            lines = [json.loads(line) for line in stream.iter_lines() if line]
        whole = c.post("/api/chat", json={**body, "stream": False}).json()
        generated = c.post("/api/generate", json={"model": MODEL, "prompt": COUNT, "logprobs": True, "top_logprobs": 2,
                                                  "options": GREEDY, "stream": False}).json()
        for path in ("/api/chat", "/api/generate"):
            bad = c.post(path, json={**body, "prompt": "x", "top_logprobs": 21, "stream": False})
            assert bad.status_code == 400 and bad.json() == {"error": "top_logprobs must be between 0 and 20"}
    for obj in [*lines, whole]:
        strict(ChatResponse, obj, allow=OLLAMA_BYTES)
    strict(GenerateResponse, generated, allow=OLLAMA_BYTES)
    entries = whole["logprobs"]
    assert [e["token"] for line in lines for e in line.get("logprobs", [])] == [e["token"] for e in entries]
    for e in entries:
        assert bytes(e["bytes"]).decode() == e["token"]
        assert all(bytes(a["bytes"]).decode() == a["token"] for a in e["top_logprobs"])


# -- Responses: an item cut short by max_output_tokens -----------------------------------------
def test_responses_item_cut_short_is_incomplete(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    resp = client.responses.create(model=MODEL, input=COUNT, max_output_tokens=4, temperature=0)
    strict(Response, resp.model_dump(mode="json", exclude_unset=True))
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in resp.output] == [("message", "incomplete")]
    # A response that ends by itself keeps its items completed.
    whole = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=200, temperature=0)
    assert whole.status == "completed" and all(o.status == "completed" for o in whole.output)


def test_responses_stream_item_cut_short_is_incomplete(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    events = list(client.responses.create(model=MODEL, input=COUNT, max_output_tokens=4, temperature=0, stream=True))
    for ev in events:
        strict(ResponseStreamEvent, ev.model_dump(mode="json", exclude_unset=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.status for e in added] == ["in_progress"]
    assert [(e.item.type, e.item.status) for e in done] == [("message", "incomplete")]
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.status == "incomplete"
    assert [o.status for o in final.response.output] == ["incomplete"]


# -- Responses: the error envelope's code and param --------------------------------------------
def test_responses_unknown_model_has_chat_code(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as info:
            client.responses.create(model="no-such-model", input="hi", stream=stream)
        assert info.value.code == "model_not_found" and info.value.param == "model"
        body: Any = info.value.body
        assert {k: body[k] for k in ("type", "param", "code")} == {
            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
        assert "no-such-model" in body["message"]


def test_responses_context_length_names_input(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    long = "word " * 3000
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, input=long, max_output_tokens=4, stream=stream)
        assert info.value.code == "context_length_exceeded" and info.value.param == "input"
        body: Any = info.value.body
        assert body["type"] == "invalid_request_error" and "context length" in body["message"]
    # Items in a list are the same field: still "input", not the chat request's "messages".
    with pytest.raises(openai.BadRequestError) as items:
        client.responses.create(model=MODEL, instructions="Be brief.", max_output_tokens=4,
                                input=[{"role": "user", "content": "hi"}, {"role": "user", "content": long}])
    assert (items.value.code, items.value.param) == ("context_length_exceeded", "input")


def test_responses_invalid_and_unsupported_fields_have_codes(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    # Checked by the chat request it becomes: named as the Responses request names it.
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=-3)
    assert (bad.value.code, bad.value.param) == ("invalid_request_error", "max_output_tokens")
    # Refused by the translation, as chat refuses what it does not implement.
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", "previous_response_id")
