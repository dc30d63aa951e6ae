"""Each server's status history (``GET /v1/status/history``, ``GET /api/v1/status/history``):
the last 15 minutes of its own figures, sampled by the server every 2 s. Against real servers:
the real SmolLM2 generating (tokens counted by the engine as they are made, prompt tokens at
each step), a real sandbox run and agent tasks on a scripted model, and requests marked as a
client's polling (``X-Conch-Poll``) or made to monitoring routes left out of the request rate."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conch import db
from conch.web.common.history import Figure, StatusHistory
from tests.web.conftest import RunningServer, start_server
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, start_thread_server

MODEL = "smollm2-135m-instruct"
POLL = {"X-Conch-Poll": "studio"}
INFERENCE_FIGURES = {
    "requests_per_s", "generated_tokens_per_s", "prefill_tokens_per_s", "active_sequences",
    "queue_depth", "models_loaded", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
    "resident_memory_bytes",
}
AGENT_FIGURES = {"requests_per_s", "active_tasks", "waiting_tasks", "sandbox_runs", "resident_memory_bytes"}


@pytest.fixture(scope="module")
def inference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running, server, thread = start_server(tmp_path_factory.mktemp("history"), n_parallel=2, n_ctx=1024)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def samples_after(c: httpx.Client, path: str, t: float, n: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    """The samples the server took after unix time ``t``, once there are ``n`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(path, params={"since": t}, headers=POLL)
        assert r.status_code == 200, r.text
        got: list[dict[str, Any]] = r.json()["samples"]
        if len(got) >= n:
            return got
        assert time.monotonic() < deadline, f"{path}: {len(got)} samples after {t}, wanted {n}"
        time.sleep(0.25)


def counted(samples: list[dict[str, Any]], name: str) -> float:
    """What a counter's rates add up to over the samples' periods."""
    return sum(s[name] * s["dt"] for s in samples)


def test_the_inference_history_says_what_it_holds(inference: RunningServer) -> None:
    with inference.client() as c:
        samples_after(c, "/v1/status/history", 0, n=2)
        body = c.get("/v1/status/history").json()
    assert body["period_s"] == 2.0 and body["window_s"] == 900.0
    assert abs(body["now"] - time.time()) < 5
    assert set(body["figures"]) == INFERENCE_FIGURES
    assert body["figures"]["generated_tokens_per_s"] == {
        "kind": "counter", "unit": "tokens/s",
        "help": "Tokens sampled by the engines, counted as each is sampled",
    }
    assert body["figures"]["active_sequences"]["kind"] == "gauge"
    s = body["samples"][-1]
    assert set(s) == INFERENCE_FIGURES | {"t", "dt"}
    assert 1.0 < s["dt"] < 4.0
    ts = [x["t"] for x in body["samples"]]
    assert ts == sorted(ts)
    assert s["resident_memory_bytes"] > 10e6
    # No GPU on a CPU build: said as null, not 0.
    if not s["gpu_memory_total_bytes"]:
        assert s["gpu_memory_used_bytes"] is None and s["gpu_memory_total_bytes"] is None


def test_the_sampler_rates_a_counter_and_holds_one_while_its_gauge_is_up() -> None:
    """StatusHistory itself, fed a scripted sequence of readings (the figures a server would
    read), sampled as the server samples: rates over the real time between samples."""
    figures = (
        Figure("tokens", "counter", "tokens/s", "t", held_by="busy"),
        Figure("requests", "counter", "req/s", "r"),
        Figure("busy", "gauge", "sequences", "b"),
    )
    readings = iter([
        {"tokens": 0, "requests": 0, "busy": 0},      # the baseline: no sample
        {"tokens": 10, "requests": 4, "busy": 1},     # 10 tokens, 4 requests
        {"tokens": 10, "requests": 4, "busy": 1},     # busy, no token: held (10 since the baseline)
        {"tokens": 16, "requests": 4, "busy": 1},     # 6 tokens
        {"tokens": 16, "requests": 4, "busy": 0},     # idle: 0, not held
        {"tokens": 3, "requests": 1, "busy": 0},      # counters went back (restart): from 0
        {"tokens": 3, "requests": None, "busy": None},  # a figure not read: null
    ])

    async def read() -> dict[str, float | None]:
        return next(readings)

    async def run() -> list[dict[str, Any] | None]:
        history = StatusHistory(figures, read, period_s=0.05, window_s=0.25)
        out = []
        for _ in range(7):
            out.append(await history.sample())
            await asyncio.sleep(0.05)
        assert len(history.samples) == 5  # 0.25 s at 0.05 s: the oldest one dropped
        assert history.to_dict(since=out[-1]["t"])["samples"] == []  # type: ignore[index]
        return out

    first, a, b, c, d, e, f = asyncio.run(run())
    assert first is None
    assert a is not None and b is not None and c is not None and d is not None and e is not None and f is not None
    assert a["tokens"] == pytest.approx(10 / a["dt"], rel=0.01) and a["requests"] == pytest.approx(4 / a["dt"], rel=0.01)
    assert "spans" not in a
    # Held: the 10 tokens over the two periods since the baseline, and said so.
    assert b["spans"]["tokens"] == pytest.approx(a["dt"] + b["dt"], abs=0.01)
    assert b["tokens"] == pytest.approx(10 / b["spans"]["tokens"], rel=0.02)
    assert b["requests"] == 0  # a counter held by nothing reads 0
    assert c["tokens"] == pytest.approx(6 / c["dt"], rel=0.01) and "spans" not in c
    assert d["tokens"] == 0 and "spans" not in d  # nothing active: a true 0
    assert e["tokens"] == pytest.approx(3 / e["dt"], rel=0.01)
    assert f["requests"] is None and f["busy"] is None and f["tokens"] == 0


@pytest.mark.parametrize("query", ["since=soon", "since=-1", "since=nan", "since=inf"])
def test_a_bad_since_is_refused_naming_it(inference: RunningServer, query: str) -> None:
    with inference.client() as c:
        r = c.get(f"/v1/status/history?{query}")
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "since"
        assert c.get("/v1/status/history").status_code == 200  # and it keeps serving


def test_polling_and_monitoring_are_not_traffic(inference: RunningServer) -> None:
    with inference.client() as c:
        t0 = c.get("/v1/status/history").json()["now"]
        for _ in range(10):
            assert c.get("/v1/models", headers=POLL).status_code == 200
            c.get("/metrics")
            c.get("/v1/health")
            c.get("/v1/status")
            c.get("/api/ps")
            c.options("/v1/models", headers={"Origin": inference.url, "Access-Control-Request-Method": "GET"})
        samples_after(c, "/v1/status/history", time.time(), n=1)  # their window closed
        got = samples_after(c, "/v1/status/history", t0, n=1)
        assert counted(got, "requests_per_s") == 0, got
        served = c.get("/v1/status").json()["requests_served"]
        # The same route without the header is traffic: every request of it counted once.
        t1 = c.get("/v1/status/history", headers=POLL).json()["now"]
        for _ in range(10):
            c.get("/v1/models")
        samples_after(c, "/v1/status/history", time.time(), n=1)
        got = samples_after(c, "/v1/status/history", t1, n=1)
        assert abs(counted(got, "requests_per_s") - 10) < 0.05, got
        # /v1/status's requests_served leaves the polling out as well: the 10, and the read
        # of `served` itself (counted once answered).
        assert c.get("/v1/status").json()["requests_served"] == served + 11


def test_tokens_are_counted_while_they_are_made(inference: RunningServer) -> None:
    """A long answer: every sample taken while tokens were streaming reads a rate above 0
    (the engine counts each token as it is sampled, the server times its samples itself), the
    prompt's tokens show up as prompt tokens read, and the rates add up to the engine's count.
    The answer is read for 5 s (two and a half sampling periods, however fast the machine makes
    tokens: a whole period then falls within it), then the client goes away."""
    manager = inference.app.state.manager
    engine_tokens = lambda: sum(e.stats.completion_tokens for e in manager.engines())  # noqa: E731
    with inference.client() as c:
        # Loaded first, so that the answer's samples are not the model's load.
        c.post("/api/generate", json={"model": MODEL, "prompt": "", "stream": False}).raise_for_status()
        before_tokens = engine_tokens()
        start = time.time()
        arrivals: list[float] = []
        body = {
            "model": MODEL, "max_tokens": 4000, "stream": True, "temperature": 0.8, "seed": 7,
            "messages": [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
        }
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = json.loads(line[6:])["choices"]
                    if delta and delta[0].get("delta", {}).get("content"):
                        arrivals.append(time.time())
                        if arrivals[-1] - arrivals[0] >= 5.0:
                            break  # the client goes away: the server ends the answer
        end = time.time()
        assert arrivals[-1] - arrivals[0] >= 5.0, "the answer was too short to span samples"
        samples_after(c, "/v1/status/history", end + 0.1, n=1)  # the last token's window closed
        made = engine_tokens() - before_tokens
        got = samples_after(c, "/v1/status/history", start - 2.5, n=1)
    during = [s for s in got if s["t"] - s["dt"] >= arrivals[0] and s["t"] <= arrivals[-1]]
    assert during, f"no sample fell within the {arrivals[-1] - arrivals[0]:.1f} s of streaming"
    assert all(s["generated_tokens_per_s"] > 0 for s in during), during
    assert all(s["active_sequences"] == 1 for s in during)
    # Every token the engine made is in the history, once (rates are rounded to 1/1000): a
    # period in which no step finished (a busy machine) reads the average since the last token
    # instead, over the span it names, and adds nothing of its own.
    exact = [s for s in got if "generated_tokens_per_s" not in s.get("spans", {})]
    assert abs(counted(exact, "generated_tokens_per_s") - made) < 1, (made, got)
    for s in got:
        if "spans" in s:
            assert s["spans"]["generated_tokens_per_s"] > s["dt"] and s["active_sequences"] == 1
    assert counted(got, "prefill_tokens_per_s") >= 10  # the prompt, read before the first token
    assert got[-1]["active_sequences"] == 0 and got[-1]["models_loaded"] == 1


# -- the agent server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedModel) -> Iterator[Server]:
    srv = start_thread_server(tmp_path_factory.mktemp("agent-history"), models_url=scripted.v1)
    yield srv
    srv.stop()


def test_agent_tasks_and_sandbox_runs_are_two_figures(agent: Server, scripted: ScriptedModel) -> None:
    """Two agent tasks whose model takes 6 s to answer, and one sandbox run of 4 s: the history
    counts 2 tasks and 1 run (before, "Active runs" counted the sandbox's runs only)."""
    goal = scripted.script("Think slowly.", {"content": final("done"), "delay": 6})
    API = "/api/v1/orchestration"
    with agent.client() as c:
        t0 = c.get("/api/v1/status/history").json()["now"]
        tasks = [c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).json()["id"] for _ in range(2)]
        ran: list[httpx.Response] = []
        run = threading.Thread(target=lambda: ran.append(
            httpx.post(agent.url + "/api/v1/execute", json={"command": "sleep(4000)\n1"}, timeout=60)))
        run.start()
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(s["active_tasks"] == 2 and s["sandbox_runs"] == 1 for s in seen):
            time.sleep(0.5)
            seen = samples_after(c, "/api/v1/status/history", t0, n=1)
        run.join(timeout=60)
        assert ran and ran[0].status_code == 200, ran
        assert any(s["active_tasks"] == 2 and s["sandbox_runs"] == 1 for s in seen), seen
        assert set(seen[-1]) == AGENT_FIGURES | {"t", "dt"}
        for tid in tasks:
            deadline = time.monotonic() + 30
            while c.get(f"{API}/tasks/{tid}").json()["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline
                time.sleep(0.2)
        settled = samples_after(c, "/api/v1/status/history", time.time(), n=1)[-1]
        assert settled["active_tasks"] == 0 and settled["sandbox_runs"] == 0
        # The two tasks and the run are traffic; the reads of them marked as polling are not.
        t1 = settled["t"]
        for _ in range(5):
            c.get(f"{API}/tasks", headers=POLL)
        samples_after(c, "/api/v1/status/history", time.time(), n=1)
        assert counted(samples_after(c, "/api/v1/status/history", t1, n=1), "requests_per_s") == 0
        body = c.get("/api/v1/status/history").json()
        assert set(body["figures"]) == AGENT_FIGURES
        assert body["figures"]["sandbox_runs"]["unit"] == "runs"


def test_a_task_waiting_for_a_person_is_counted_as_waiting(agent: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("List the workspace (asks first)", tool("ls", path="."), final("listed"))
    API = "/api/v1/orchestration"
    with agent.client() as c:
        body = {"goal": goal, "tools": ["ls"], "max_steps": 3, "approvals": {"tools": {"ls": "ask"}}}
        task = c.post(f"{API}/tasks", json=body).json()
        deadline = time.monotonic() + 30
        while c.get(f"{API}/tasks/{task['id']}").json()["status"] != "waiting":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        got = samples_after(c, "/api/v1/status/history", time.time(), n=1)[-1]
        assert got["waiting_tasks"] == 1 and got["active_tasks"] == 0, got
        assert c.post(f"{API}/tasks/{task['id']}/cancel").status_code == 200
        got = samples_after(c, "/api/v1/status/history", time.time(), n=1)[-1]
        assert got["waiting_tasks"] == 0, got


def test_the_agent_history_refuses_a_bad_since(agent: Server) -> None:
    with agent.client() as c:
        r = c.get("/api/v1/status/history?since=yesterday")
        assert r.status_code == 400
        assert "since" in r.json()["error"]["message"]
        assert c.get("/api/v1/status/history?since=0").status_code == 200
