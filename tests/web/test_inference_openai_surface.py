"""The whole OpenAI surface honoured or refused: chat logprobs (checked against llama.cpp's own
logits), logit_bias, refused and ignored fields, the legacy completions API through the
official ``openai`` client, and model capabilities."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from conch.inference.models.bundled import find_bundled_gguf
from conch.inference.models.store import ModelRecord
from tests.vendor_shapes import strict
from tests.web.conftest import RunningServer, start_server

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name three colours."}]


def _post(server: RunningServer, path: str, **body: Any) -> httpx.Response:
    with server.client() as c:
        return c.post(path, json=body)


# -- chat logprobs -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_sequence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of one sequence: every request's cells sit where a fresh prefill puts them.
    In the session's shared server, what earlier tests left in the KV pool moves a request's
    cells, and a one-row decode step's attention sums by cell index (docs/inference.md), so
    outputs can differ at a near-tie between two requests there."""
    running, server, thread = start_server(tmp_path_factory.mktemp("one-seq"), n_parallel=1, n_ctx=1024)
    yield running
    server.should_exit = True
    thread.join(timeout=30)


def test_chat_logprobs_plain(one_sequence_server: RunningServer) -> None:
    """logprobs change nothing of the output: the same text as a plain request."""
    client = one_sequence_server.openai()
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0,  # type: ignore[arg-type]
                                          logprobs=True, top_logprobs=5)
    strict(ChatCompletion, resp.model_dump(mode="json", exclude_unset=True))
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert len(lp.content) == resp.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(e.token for e in lp.content) == resp.choices[0].message.content
    for e in lp.content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 5 and bytes(e.bytes or []).decode() == e.token
        # Greedy: the sampled token is the likeliest one.
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == resp.choices[0].message.content


def test_chat_logprobs_streamed(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0,  # type: ignore[arg-type]
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 stream_options={"include_usage": True}))
    entries = []
    for ch in chunks:
        strict(ChatCompletionChunk, ch.model_dump(mode="json", exclude_unset=True))
        for choice in ch.choices:
            if choice.logprobs and choice.logprobs.content:
                entries.extend(choice.logprobs.content)
    usage = chunks[-1].usage
    assert usage is not None and len(entries) == usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_top_logprobs_needs_logprobs(inference_server: RunningServer) -> None:
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, top_logprobs=3)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, logprobs=True, top_logprobs=21)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_logprobs_equal_llama_cpp_log_softmax(inference_server: RunningServer) -> None:
    """The served logprobs are log-softmax of the logits llama-cpp-python's own ``Llama``
    computes for the same tokens, given the kernels conch's context uses (flash attention,
    micro-batches of 63: other kernels move the logits in the second decimal). The check
    against the very row the engine sampled from is tests/inference/test_engine_logprobs.py."""
    import llama_cpp

    prompt = "The capital of France is"
    resp = _post(inference_server, "/v1/completions", model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    assert resp.status_code == 200, resp.text
    lp = resp.json()["choices"][0]["logprobs"]
    path = find_bundled_gguf()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, logits_all=True, verbose=False, flash_attn=True,
                          n_ubatch=63, n_batch=512)
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    llm.eval(tokens)
    for k, (token_text, reported) in enumerate(zip(lp["tokens"], lp["token_logprobs"], strict=True)):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        log_softmax = logits - (logits.max() + math.log(np.exp(logits - logits.max()).sum()))
        best = int(np.argmax(logits))
        assert llm.detokenize([best]).decode("utf-8", "replace") == token_text, f"token {k}"
        assert reported == pytest.approx(log_softmax[best], abs=1e-4), f"token {k}"
        top = dict(sorted(((llm.detokenize([int(t)]).decode("utf-8", "replace"), log_softmax[t])
                           for t in np.argsort(-logits)[:3]), key=lambda kv: -kv[1]))
        for tok, value in lp["top_logprobs"][k].items():
            assert value == pytest.approx(top[tok], abs=1e-4)
        llm.eval([best])


# -- logit_bias, penalties, refused and ignored fields ---------------------------------------------
def _greedy(server: RunningServer, **extra: Any) -> dict[str, Any]:
    r = _post(server, "/v1/chat/completions", model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
              logprobs=True, **extra)
    assert r.status_code == 200, r.text
    return r.json()


def _token_id(server: RunningServer, text: str) -> int:
    # The token a greedy answer starts with, found by its bytes in the model's vocabulary.
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(find_bundled_gguf()), n_ctx=64, verbose=False, vocab_only=True)
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert len(ids) == 1, (text, ids)
    return int(ids[0])


def test_logit_bias_removes_and_forces_tokens(inference_server: RunningServer) -> None:
    base = _greedy(inference_server)
    first = base["choices"][0]["logprobs"]["content"][0]["token"]
    tok = _token_id(inference_server, first)
    banned = _greedy(inference_server, logit_bias={str(tok): -100})
    assert tok not in [_token_id(inference_server, e["token"]) for e in banned["choices"][0]["logprobs"]["content"]
                       if e["token"] == first]
    assert banned["choices"][0]["logprobs"]["content"][0]["token"] != first
    forced_id = _token_id(inference_server, " banana")
    forced = _greedy(inference_server, logit_bias={str(forced_id): 100})
    assert forced["choices"][0]["logprobs"]["content"][0]["token"] == " banana"
    for bad in ({"x": 1}, {"99999999": 1}, {"5": 101}):
        r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, logit_bias=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_penalties_and_n_are_honoured(inference_server: RunningServer) -> None:
    # A long greedy answer always repeats some token (a space, "the", a comma); a penalty of 2 on
    # each repeat must change the greedy path. Which tokens repeat differs between CPU builds, so
    # the test checks that precondition instead of naming a fixed output.
    ask = [{"role": "user", "content": "Write a long story about a dog and a cat."}]
    body = {"model": MODEL, "messages": ask, "max_tokens": 48, "temperature": 0, "logprobs": True}
    base = _post(inference_server, "/v1/chat/completions", **body).json()["choices"][0]
    tokens = [e["token"] for e in base["logprobs"]["content"]]
    assert len(set(tokens)) < len(tokens), tokens
    penalised = _post(inference_server, "/v1/chat/completions", **body, frequency_penalty=2.0,
                      presence_penalty=2.0).json()["choices"][0]
    assert penalised["message"]["content"] != base["message"]["content"]
    penalised_tokens = [e["token"] for e in penalised["logprobs"]["content"]]
    assert tokens[0] == penalised_tokens[0]  # nothing generated yet, nothing to penalise
    many = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, max_tokens=8, n=3, seed=5).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]


@pytest.mark.parametrize("field", ["audio", "prediction", "web_search_options", "reasoning_effort", "functions", "function_call"])
def test_unimplemented_openai_fields_are_refused_by_name(inference_server: RunningServer, field: str) -> None:
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, **{field: {"x": 1} if field != "reasoning_effort" else "low"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]


def test_ignored_fields_and_unknown_fields(inference_server: RunningServer) -> None:
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, max_tokens=4, user="u",
              metadata={"k": "v"}, service_tier="auto", parallel_tool_calls=False, store=False, modalities=["text"],
              some_vendor_field=1)
    assert r.status_code == 200, r.text
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO, modalities=["text", "audio"])
    assert r.status_code == 400 and r.json()["error"]["param"] == "modalities"


def test_malformed_tool_call_arguments_in_history(inference_server: RunningServer) -> None:
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=messages)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages[1].tool_calls[0].function.arguments" and "messages[1]" in err["message"]


def test_response_format_schema_error_param_not_doubled(inference_server: RunningServer) -> None:
    r = _post(inference_server, "/v1/chat/completions", model=MODEL, messages=HELLO,
              response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"


# -- capabilities ------------------------------------------------------------------------------
def test_models_list_capabilities_and_source_models(inference_server: RunningServer) -> None:
    store = inference_server.app.state.store
    store.register(ModelRecord(id="src-only", format="safetensors", path=str(find_bundled_gguf()), capabilities=[]))
    try:
        data = {m["id"]: m for m in _post_get(inference_server, "/v1/models")["data"]}
        assert set(data[MODEL]["capabilities"]) >= {"chat"}
        assert data["src-only"]["capabilities"] == []
        for path, body in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/embeddings", {"input": "x"})):
            r = _post(inference_server, path, model="src-only", **body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "model_needs_conversion" and "/v1/models/src-only/convert" in err["message"]
    finally:
        store.delete("src-only")


def _post_get(server: RunningServer, path: str) -> dict[str, Any]:
    with server.client() as c:
        return c.get(path).json()  # type: ignore[no-any-return]


# -- legacy completions --------------------------------------------------------------------------
def test_completions_plain_and_prompt_forms(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    resp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    strict(Completion, resp.model_dump(mode="json", exclude_unset=True))
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-") and resp.choices[0].text
    assert resp.usage is not None and resp.usage.completion_tokens <= 6
    default = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert default.usage is not None and default.usage.completion_tokens <= 16  # OpenAI's default max_tokens
    many = client.completions.create(model=MODEL, prompt=["Hello", "Goodbye"], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text  # greedy: the same per prompt
    ids = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
    assert ids.choices[0].finish_reason in ("stop", "length")
    arrays = client.completions.create(model=MODEL, prompt=[[504, 3458], [504]], max_tokens=2)
    assert len(arrays.choices) == 2
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
    assert " 7" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    a = client.completions.create(model=MODEL, prompt="Tell me", max_tokens=8, temperature=1, seed=42)
    b = client.completions.create(model=MODEL, prompt="Tell me", max_tokens=8, temperature=1, seed=42)
    assert a.choices[0].text == b.choices[0].text


def test_completions_echo_and_logprobs(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    echo = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text.startswith("The capital of France is")
    lp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
    logprobs = lp.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and "".join(logprobs.tokens) == lp.choices[0].text
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    assert logprobs.top_logprobs is not None and all(len(t) == 2 for t in logprobs.top_logprobs)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", echo=True, logprobs=1)
    assert info.value.body["param"] == "echo"  # type: ignore[index]


def test_completions_stream(inference_server: RunningServer) -> None:
    client = inference_server.openai()
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "text_completion" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(c.text for ch in chunks for c in ch.choices)
    plain = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert text == plain.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    finals = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    with inference_server.client() as c, c.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    echo = list(client.completions.create(model=MODEL, prompt="Hi there", max_tokens=2, echo=True, stream=True))
    assert echo[0].choices[0].text == "Hi there"


def test_completions_suffix_needs_fim(inference_server: RunningServer) -> None:
    r = _post(inference_server, "/v1/completions", model=MODEL, prompt="def add(a, b):\n    return", suffix="\n", max_tokens=4)
    body = r.json()
    if r.status_code == 400:  # the model has no fill-in-the-middle tokens
        assert body["error"]["param"] == "suffix" and "fill-in-the-middle" in body["error"]["message"]
    else:
        assert r.status_code == 200 and isinstance(body["choices"][0]["text"], str)


def test_completions_errors(inference_server: RunningServer) -> None:
    for body, param in (({"prompt": "x", "best_of": 3}, "best_of"), ({"prompt": [[]]}, "prompt"),
                        ({"prompt": [10**9]}, "prompt"), ({"prompt": "x", "stop": list("abcde")}, "stop")):
        r = _post(inference_server, "/v1/completions", model=MODEL, **body)
        assert r.status_code == 400, (body, r.text)
        assert (r.json()["error"]["param"] or "").startswith(param)
    r = _post(inference_server, "/v1/completions", model="no-such", prompt="x")
    assert r.status_code == 404


def test_responses_logprobs(inference_server: RunningServer) -> None:
    r = _post(inference_server, "/v1/responses", model=MODEL, input="Hi", max_output_tokens=4, temperature=0, top_logprobs=2)
    assert r.status_code == 200, r.text
    part = r.json()["output"][0]["content"][0]
    assert part["logprobs"] and all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])
    assert json.dumps(part)  # plain JSON
