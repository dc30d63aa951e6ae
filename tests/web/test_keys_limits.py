"""Limits on the real request paths of both servers: every refusal a ``429`` with
``Retry-After`` (none when waiting cannot help) in the API's own shape; token budgets
reserved before generation and settled to what was generated (streams, and clients that
leave, included); the runs' limits and their CPU measured in the sandbox; the models
allow-list; and a run's model calls counted against the key that asked for the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from conch import db
from tests.web.agent_fixtures import AgentServer, start_agent_server
from tests.web.conftest import RunningServer, start_server
from tests.web.keys_support import ADMIN, ADMIN_KEY, bearer, make_key

MODEL = "smollm2-135m-instruct"


@dataclass
class Both:
    agent: AgentServer
    inference: RunningServer

    def key(self, **body: Any) -> tuple[str, str]:
        return make_key(self.agent.url, **body)

    def usage(self, key_id: str) -> dict[str, Any]:
        r = httpx.get(self.agent.url + "/api/v1/usage", params={"key": key_id}, headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        return {u["limit"]: u for u in r.json()["limits"]}


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    data = tmp_path_factory.mktemp("keys-limits")
    inference, server, thread = start_server(data, admin_key=ADMIN_KEY, n_ctx=1024)
    agent = start_agent_server(data, admin_key=ADMIN_KEY, models_url=inference.v1, wall_time_s=10.0)
    yield Both(agent, inference)
    agent.stop()
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _chat(base: str, secret: str, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "temperature": 0, **extra}  # fmt: skip
    return httpx.post(base + "/v1/chat/completions", json=body, headers=bearer(secret), timeout=120)


# -- the agent server ------------------------------------------------------------------------


def test_requests_per_minute_on_the_agent_server(both: Both) -> None:
    _kid, secret = both.key(name="rpm", scopes=["execute"], limits={"requests_per_minute": 3})
    with httpx.Client(base_url=both.agent.url, headers=bearer(secret), timeout=60) as c:
        # The fast path, a documented route and the discovery routes count alike.
        assert c.post("/api/v1/execute", json={"command": "1"}).status_code == 200
        assert c.post("/api/v1/call/upper", json={"args": ["a"]}).status_code == 200
        assert c.get("/api/v1/types").status_code == 200
        for r in (c.post("/api/v1/execute", json={"command": "1"}), c.get("/api/v1/types"),
                  c.post("/api/v1/stream/eval", json={"code": "1"})):  # fmt: skip
            assert r.status_code == 429, r.text
            err = r.json()["error"]
            assert err["kind"] == "LimitError" and err["where"] == "requests_per_minute"
            assert err["code"] == "rate_limit_exceeded"
            assert 1 <= int(r.headers["retry-after"]) <= 60


def test_runs_per_minute_and_concurrent_runs(both: Both) -> None:
    _kid, secret = both.key(name="runs", scopes=["execute"],
                            limits={"runs_per_minute": 2, "concurrent_runs": 5})  # fmt: skip
    with httpx.Client(base_url=both.agent.url, headers=bearer(secret), timeout=60) as c:
        assert c.post("/api/v1/eval", json={"code": "1"}).status_code == 200
        assert c.post("/api/v1/pipeline", json={"input": [1], "steps": ["sum"]}).status_code == 200
        r = c.post("/api/v1/execute", json={"command": "1"})
        assert r.status_code == 429 and r.json()["error"]["where"] == "runs_per_minute"
        # Discovery is not a run: it still answers.
        assert c.get("/api/v1/types").status_code == 200

    _kid, one = both.key(name="one at a time", scopes=["execute"], limits={"concurrent_runs": 1})
    import threading

    results: list[int] = []

    def slow() -> None:
        r = httpx.post(both.agent.url + "/api/v1/execute", json={"command": "sleep(1500ms); 1"},
                       headers=bearer(one), timeout=60)  # fmt: skip
        results.append(r.status_code)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.5)
    r = httpx.post(both.agent.url + "/api/v1/execute", json={"command": "1"}, headers=bearer(one), timeout=60)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["where"] == "concurrent_runs" and r.headers["retry-after"] == "1"
    t.join()
    assert results == [200]
    # The lease went with the run: the next one runs.
    r = httpx.post(both.agent.url + "/api/v1/execute", json={"command": "2"}, headers=bearer(one), timeout=60)
    assert r.status_code == 200


def test_cpu_seconds_per_day_counts_what_the_sandbox_measured(both: Both) -> None:
    key_id, secret = both.key(name="cpu", scopes=["execute"], limits={"cpu_seconds_per_day": 1.0})
    spin = "let mut n = 0\nwhile n < 3000000 { n = n + 1 }\nn"
    with httpx.Client(base_url=both.agent.url, headers=bearer(secret), timeout=60) as c:
        r = c.post("/api/v1/eval", json={"code": "1 + 1", "limits": {"wall_time_s": 0.5}})
        assert r.status_code == 200, r.text
        used = both.usage(key_id)["cpu_seconds_per_day"]["used"]
        # Settled to the run's CPU time (far below the 0.5 s reserved).
        assert 0 <= used < 0.3, used
        spent = 0.0
        for _ in range(40):
            r = c.post("/api/v1/eval", json={"code": spin, "limits": {"wall_time_s": 2}})
            if r.status_code == 429:
                break
            assert r.status_code == 200, r.text
            spent = both.usage(key_id)["cpu_seconds_per_day"]["used"]
        assert r.status_code == 429, "the CPU budget never ran out"
        err = r.json()["error"]
        assert err["where"] == "cpu_seconds_per_day" and err["code"] == "insufficient_quota"
        # Spent, and not overspent: the last run could use only what was left (its wall
        # time lowered to it), and a worker's CPU time never passes its wall time.
        assert 0.9 <= spent <= 1.0 + 0.05, spent


def test_the_stream_routes_are_runs_too(both: Both) -> None:
    _kid, secret = both.key(name="streams", scopes=["execute"], limits={"runs_per_minute": 1})
    with httpx.Client(base_url=both.agent.url, headers=bearer(secret), timeout=60) as c:
        r = c.post("/api/v1/stream/execute", json={"command": "1"})
        assert r.status_code == 200 and "event: complete" in r.text
        r = c.post("/api/v1/stream/pipeline", json={"input": [1], "steps": ["sum"]})
        assert r.status_code == 429 and r.json()["error"]["where"] == "runs_per_minute"


# -- the inference server --------------------------------------------------------------------


def test_a_token_budget_is_reserved_then_settled(both: Both) -> None:
    key_id, secret = both.key(name="tokens", scopes=["inference"], limits={"tokens_per_day": 1000})
    r = _chat(both.inference.url, secret, max_tokens=8)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert both.usage(key_id)["tokens_per_day"]["used"] == usage["total_tokens"]
    # A request whose worst case passes what is left is refused before it generates, in
    # OpenAI's shape, with nothing recorded.
    r = _chat(both.inference.url, secret, max_tokens=990)
    assert r.status_code == 429, r.text
    err = r.json()["error"]
    assert err["code"] == "insufficient_quota" and err["type"] == "rate_limit_error"
    assert err["param"] == "tokens_per_day"
    assert both.usage(key_id)["tokens_per_day"]["used"] == usage["total_tokens"]


def test_a_stream_cut_short_is_billed_for_what_it_generated(both: Both) -> None:
    key_id, secret = both.key(name="cut short", scopes=["inference"], limits={"tokens_per_day": 100_000})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from 1 to 200."}],
            "max_tokens": 400, "temperature": 0, "stream": True}  # fmt: skip
    with httpx.Client(timeout=120) as c, c.stream("POST", both.inference.url + "/v1/chat/completions",
                                                  json=body, headers=bearer(secret)) as r:  # fmt: skip
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                chunks += 1
            if chunks >= 6:
                break  # the client leaves
    deadline = time.monotonic() + 10
    used = None
    while time.monotonic() < deadline:
        used = both.usage(key_id)["tokens_per_day"]["used"]
        # Settled (the reservation was prompt + 400): to the prompt and what was generated.
        if used < 300:
            break
        time.sleep(0.1)
    assert used is not None and 10 < used < 300, used


def test_refusals_in_each_apis_shape(both: Both) -> None:
    _kid, secret = both.key(name="no tokens", scopes=["inference"], limits={"tokens_per_minute": 0})
    base = both.inference.url
    msg = [{"role": "user", "content": "hi"}]
    r = _chat(base, secret)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert "retry-after" not in r.headers  # a request larger than the limit: waiting cannot help
    r = httpx.post(base + "/v1/messages", json={"model": MODEL, "messages": msg, "max_tokens": 4},
                   headers={"x-api-key": secret}, timeout=60)  # fmt: skip
    assert r.status_code == 429
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error"
    r = httpx.post(base + "/api/chat", json={"model": MODEL, "messages": msg, "stream": True},
                   headers=bearer(secret), timeout=60)  # fmt: skip
    assert r.status_code == 429 and isinstance(r.json()["error"], str)
    r = httpx.post(base + "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 4},
                   headers=bearer(secret), timeout=60)  # fmt: skip
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                   headers=bearer(secret), timeout=60)  # fmt: skip
    assert r.status_code == 429
    r = httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": "hi"}, headers=bearer(secret),
                   timeout=60)
    assert r.status_code == 429
    # A rate with room again later says when: Retry-After.
    _kid, slow = both.key(name="a little", scopes=["inference"], limits={"tokens_per_minute": 100})
    first = _chat(base, slow, max_tokens=4)
    assert first.status_code == 200
    prompt = first.json()["usage"]["prompt_tokens"]
    r = _chat(base, slow, max_tokens=100 - prompt)  # fits the limit, not what is left of it
    assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60


def test_requests_per_minute_on_the_inference_server(both: Both) -> None:
    _kid, secret = both.key(name="rpm inference", scopes=["inference"], limits={"requests_per_minute": 2})
    with httpx.Client(base_url=both.inference.url, headers=bearer(secret), timeout=60) as c:
        assert c.get("/v1/models").status_code == 200
        assert c.get("/api/tags").status_code == 200
        r = c.get("/api/tags")
        assert r.status_code == 429 and isinstance(r.json()["error"], str)
        assert int(r.headers["retry-after"]) >= 1
        r = c.get("/v1/models")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"


def test_the_models_allow_list(both: Both) -> None:
    _kid, secret = both.key(name="only other models", scopes=["inference"], models=["local:qwen*"])
    r = _chat(both.inference.url, secret)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "model_not_allowed" and MODEL in r.json()["error"]["message"]
    r = httpx.post(both.inference.url + "/api/generate", json={"model": MODEL, "prompt": "x"},
                   headers=bearer(secret), timeout=60)  # fmt: skip
    assert r.status_code == 403 and isinstance(r.json()["error"], str)
    listed = httpx.get(both.inference.url + "/v1/models", headers=bearer(secret), timeout=60).json()
    assert MODEL not in {m["id"] for m in listed["data"]}
    _kid, ok = both.key(name="smollm only", scopes=["inference"], models=["local:smollm2-*"])
    assert _chat(both.inference.url, ok).status_code == 200
    listed = httpx.get(both.inference.url + "/v1/models", headers=bearer(ok), timeout=60).json()
    assert MODEL in {m["id"] for m in listed["data"]}


def test_a_runs_model_calls_count_against_its_key(both: Both) -> None:
    """ai() in a run reaches the inference server with a pass of the run's key: its tokens
    are that key's, and its allow-list holds there too."""
    key_id, secret = both.key(name="ai in a run", scopes=["execute", "inference"],
                              limits={"tokens_per_day": 100_000})  # fmt: skip
    code = f'ai("Say hi.", model="{MODEL}", max_tokens=4)'
    r = httpx.post(both.agent.url + "/api/v1/eval", json={"code": code}, headers=bearer(secret), timeout=120)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert both.usage(key_id)["tokens_per_day"]["used"] > 0
    # A key without inference cannot call models from its runs either.
    _kid, runs_only = both.key(name="runs only", scopes=["execute"])
    r = httpx.post(both.agent.url + "/api/v1/eval", json={"code": code}, headers=bearer(runs_only), timeout=120)
    assert r.json()["success"] is False and "inference" in r.json()["error"]["message"]


def test_counters_by_key_name(both: Both) -> None:
    _kid, secret = both.key(name="counted-key", scopes=["inference"], limits={"tokens_per_minute": 10_000})
    assert _chat(both.inference.url, secret).status_code == 200
    text = httpx.get(both.inference.url + "/metrics", headers=ADMIN, timeout=60).text
    assert 'conch_key_requests_total{key="counted-key"} 1.0' in text
    assert 'conch_key_tokens_total{key="counted-key"}' in text
    _kid, none = both.key(name="refused-key", scopes=["inference"], limits={"tokens_per_minute": 0})
    _chat(both.inference.url, none)
    text = httpx.get(both.inference.url + "/metrics", headers=ADMIN, timeout=60).text
    assert 'conch_key_refusals_total{key="refused-key",limit="tokens_per_minute"} 1.0' in text
