"""Server-Sent Event streams: order, ids, incremental delivery, cancellation (SPEC §2.1)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
from httpx_sse import connect_sse

from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer


def _events(server: AgentServer, path: str, body: dict[str, Any]) -> list[tuple[str, int, Any]]:
    out = []
    with server.client() as c, connect_sse(c, "POST", path, json=body) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert source.response.headers["cache-control"] == "no-cache"
        assert source.response.headers["x-accel-buffering"] == "no"
        for sse in source.iter_sse():
            out.append((sse.event, int(sse.id), json.loads(sse.data)))
    return out


def _check_order(events: list[tuple[str, int, Any]]) -> None:
    kinds = [e[0] for e in events]
    assert kinds[0] == "start"
    assert kinds[-1] in ("complete", "error")
    assert all(k in ("progress", "data") for k in kinds[1:-1])
    ids = [e[1] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert isinstance(events[0][2]["id"], str) and events[0][2]["id"]


def test_stream_execute_events(agent_server: AgentServer) -> None:
    events = _events(
        agent_server, "/api/v1/stream/execute", {"command": 'print("hi")\nlet x = 2\nx * 21'}
    )
    _check_order(events)
    kinds = [e[0] for e in events]
    assert kinds == ["start", "progress", "data", "progress", "progress", "complete"]
    progress = [e[2] for e in events if e[0] == "progress"]
    assert [(p["step"], p["total"]) for p in progress] == [(1, 3), (2, 3), (3, 3)]
    assert progress[1]["message"] == "let x = 2"
    assert events[2][2] == {"result": "hi"}
    complete = events[-1][2]
    assert complete["result"] == "42"
    assert isinstance(complete["elapsed_ms"], int)


def test_stream_array_elements_and_count(agent_server: AgentServer) -> None:
    events = _events(
        agent_server, "/api/v1/stream/eval", {"code": "[1, 2, 3] | map(fn(x) => x * 2)"}
    )
    _check_order(events)
    data = [e[2]["result"] for e in events if e[0] == "data"]
    assert data == ["2", "4", "6"]
    assert events[-1][2]["result"] == "3"  # for a streamed Array, the count


def test_stream_pipeline_progress_before_each_step(agent_server: AgentServer) -> None:
    events = _events(
        agent_server,
        "/api/v1/stream/pipeline",
        {"input": [1, 2, 3], "steps": ["map(fn(x) => x * 10)", "reverse"]},
    )
    _check_order(events)
    assert [e[0] for e in events] == [
        "start",
        "progress",
        "progress",
        "data",
        "data",
        "data",
        "complete",
    ]
    assert events[1][2] == {"step": 1, "total": 2, "message": "map(fn(x) => x * 10)"}
    assert events[2][2]["step"] == 2
    assert [e[2]["result"] for e in events if e[0] == "data"] == ["30", "20", "10"]


def test_stream_error_event(agent_server: AgentServer) -> None:
    events = _events(agent_server, "/api/v1/stream/eval", {"code": "let x = (1 + )"})
    _check_order(events)
    kind, _, data = events[-1]
    assert kind == "error"
    assert data["kind"] == "SyntaxError"
    assert (data["line"], data["column"]) == (1, 14)
    assert "line 1" in data["message"]


def test_print_lines_arrive_in_order(agent_server: AgentServer) -> None:
    events = _events(
        agent_server,
        "/api/v1/stream/eval",
        {"code": 'for i in range(0, 5) { print("line ${i}") }\n"done"'},
    )
    data = [e[2]["result"] for e in events if e[0] == "data"]
    assert data == [f"line {i}" for i in range(5)]
    assert events[-1][2]["result"] == "done"


def test_lazy_pipeline_over_huge_range_finishes(agent_server: AgentServer) -> None:
    # Materialising 10**9 elements would hit the 3 s wall time; laziness finishes at once.
    body = {
        "command": "range(0, 10**9) | map(fn(x) => x * 2) | take(5)",
        "limits": {"wall_time_s": 3},
    }
    events = _events(agent_server, "/api/v1/stream/execute", body)
    _check_order(events)
    assert [e[2]["result"] for e in events if e[0] == "data"] == ["0", "2", "4", "6", "8"]
    assert events[-1][0] == "complete" and events[-1][2]["result"] == "5"
    with agent_server.client() as c:
        plain = c.post("/api/v1/execute", json=body).json()
    assert plain["success"] and plain["value"] == [0, 2, 4, 6, 8]


def test_slow_producer_streams_incrementally(agent_server: AgentServer) -> None:
    # Each element takes 300 ms: the first must arrive long before the run completes.
    started = time.perf_counter()
    first_data = complete = None
    with (
        agent_server.client() as c,
        connect_sse(
            c,
            "POST",
            "/api/v1/stream/execute",
            json={"command": "range(0, 5) | map(fn(x) => sleep(300))"},
        ) as source,
    ):
        for sse in source.iter_sse():
            now = time.perf_counter() - started
            if sse.event == "data" and first_data is None:
                first_data = now
            if sse.event in ("complete", "error"):
                assert sse.event == "complete", sse.data
                complete = now
    assert first_data is not None and complete is not None
    assert complete - first_data >= 0.6  # four more elements of 300 ms came after the first


def test_disconnect_cancels_the_run_and_replaces_the_worker(agent_server: AgentServer) -> None:
    pool = agent_server.pool
    before = pool.restarts["cancelled"]
    busy: list[int] = []
    with (
        agent_server.client() as c,
        connect_sse(
            c,
            "POST",
            "/api/v1/stream/execute",
            json={"command": "range(0, 10**9) | map(fn(x) => sleep(50))"},
        ) as source,
    ):
        for sse in source.iter_sse():
            if sse.event == "data":
                busy = pool.busy_pids()
                break
    assert len(busy) == 1
    pid = busy[0]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (
            pool.restarts["cancelled"] > before
            and pid not in pool.worker_pids()
            and not _alive(pid)
        ):
            break
        time.sleep(0.05)
    assert pool.restarts["cancelled"] == before + 1
    assert pid not in pool.worker_pids()
    assert not _alive(pid)
    # A replacement takes its place and serves the next run.
    deadline = time.monotonic() + 15
    while len(pool.worker_pids()) < pool.size and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pool.worker_pids()) == pool.size
    with agent_server.client() as c:
        assert c.post("/api/v1/execute", json={"command": "1 + 1"}).json()["result"] == "2"
        metrics = c.get("/metrics").text
    assert 'conch_worker_restarts_total{reason="cancelled"}' in metrics


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reaped process is gone; a zombie still answers kill(0) until reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_stream_malformed_body_is_400(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post("/api/v1/stream/pipeline", json={"input": []})
    assert r.status_code == 400
    assert r.json()["error"]["kind"] == "RequestError"


def test_stream_via_raw_http_has_event_and_id_lines(agent_server: AgentServer) -> None:
    with httpx.Client(base_url=agent_server.url) as c:
        text = c.post("/api/v1/stream/eval", json={"code": "1"}).text
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert blocks[0].splitlines()[0] == "event: start"
    for block in blocks:
        lines = block.splitlines()
        assert lines[0].startswith("event: ")
        assert lines[1].startswith("id: ")
        assert lines[2].startswith("data: ")
