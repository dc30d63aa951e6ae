"""Workflows over HTTP: DAG validation, concurrency, retries, timeouts, skips, cancel,
interpolation and event streams, against a real agent server."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

from tests.orchestration.test_agents_tasks import read_sse
from testsupport.scripted_model import ScriptedModel, final
from testsupport.servers import Server, finished, wait_for

API = "/api/v1/orchestration"


def create(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"{API}/workflows", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def run_workflow(c: httpx.Client, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    wf = create(c, body)
    return wait_for(c, f"{API}/workflows/{wf['id']}", finished, timeout)


def steps_by_id(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in wf["steps"]}


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_created_record_shape(server: Server) -> None:
    with server.client() as c:
        wf = create(c, {"name": "shape", "steps": [{"id": "a", "run": "1 + 1"}]})
        assert set(wf) >= {"id", "name", "status", "steps", "created_at", "finished_at"}
        assert wf["status"] == "running"
        assert set(wf["steps"][0]) >= {
            "id",
            "status",
            "result",
            "error",
            "attempts",
            "started_at",
            "finished_at",
        }
        done = wait_for(c, f"{API}/workflows/{wf['id']}", finished)
        assert done["status"] == "succeeded" and done["steps"][0]["result"] == 2
        assert any(w["id"] == wf["id"] for w in c.get(f"{API}/workflows").json())
        assert c.get(f"{API}/workflows/wf_nope").status_code == 404


def test_dag_validation_is_400(server: Server) -> None:
    bad = [
        (
            {
                "steps": [
                    {"id": "a", "run": "1", "depends_on": ["b"]},
                    {"id": "b", "run": "1", "depends_on": ["a"]},
                ]
            },
            "cycle",
        ),
        ({"steps": [{"id": "a", "run": "1", "depends_on": ["ghost"]}]}, "unknown step id"),
        ({"steps": [{"id": "a", "run": "1"}, {"id": "a", "run": "2"}]}, "duplicate"),
        ({"steps": [{"id": "a"}]}, "exactly one"),
        (
            {
                "steps": [
                    {"id": "a", "run": "1", "task": {"goal": "g", "tools": [], "max_steps": 1}}
                ]
            },
            "exactly one",
        ),
        ({"steps": []}, "steps"),
        ({"steps": [{"id": "a", "run": "1", "colour": "red"}]}, "colour"),
        (
            {"steps": [{"id": "a", "task": {"goal": "x", "tools": ["nope"], "max_steps": 2}}]},
            "nope",
        ),
        (
            {
                "steps": [
                    {"id": "a", "run": "1"},
                    {"id": "b", "task": {"goal": "${steps.a.result}", "tools": [], "max_steps": 1}},
                ]
            },
            "does not depend",
        ),
        ({"steps": [{"id": "a", "run": "1", "retries": -1}]}, "retries"),
    ]
    with server.client() as c:
        for body, needle in bad:
            r = c.post(f"{API}/workflows", json=body)
            assert r.status_code == 400, (body, r.text)
            assert needle in r.json()["error"]["message"], (needle, r.json())


def test_diamond_runs_independent_steps_concurrently(server: Server) -> None:
    body = {
        "name": "diamond",
        "inputs": {"n": 4},
        "steps": [
            {"id": "a", "run": "inputs.n"},
            {"id": "b", "depends_on": ["a"], "run": "sleep(600); steps.a.result * 2"},
            {"id": "c", "depends_on": ["a"], "run": "sleep(600); steps.a.result * 3"},
            {"id": "d", "depends_on": ["b", "c"], "run": "steps.b.result + steps.c.result"},
        ],
    }
    with server.client() as c:
        wf = run_workflow(c, body)
    assert wf["status"] == "succeeded", wf
    s = steps_by_id(wf)
    assert s["d"]["result"] == 20
    b, cc = s["b"], s["c"]
    # b and c overlapped in time: each started before the other finished.
    assert ts(b["started_at"]) < ts(cc["finished_at"]) and ts(cc["started_at"]) < ts(
        b["finished_at"]
    )
    assert ts(s["d"]["started_at"]) >= max(ts(b["finished_at"]), ts(cc["finished_at"]))


def test_retry_succeeds_on_second_attempt(server: Server) -> None:
    code = 'if exists("retry-flag") { "ok" } else { write("retry-flag", "x"); throw "first attempt fails" }'
    with server.client() as c:
        wf = run_workflow(
            c, {"steps": [{"id": "flaky", "run": code, "retries": 2, "backoff_s": 0.1}]}
        )
    step = wf["steps"][0]
    assert wf["status"] == "succeeded"
    assert step["status"] == "succeeded" and step["attempts"] == 2 and step["result"] == "ok"


def test_timeout_fails_step_and_skips_dependents(server: Server) -> None:
    body = {
        "steps": [
            {"id": "slow", "run": "sleep(10000); 1", "timeout_s": 0.5},
            {"id": "after", "depends_on": ["slow"], "run": "2"},
            {"id": "later", "depends_on": ["after"], "run": "3"},
            {"id": "free", "run": "4"},
        ]
    }
    with server.client() as c:
        wf = run_workflow(c, body)
    s = steps_by_id(wf)
    assert wf["status"] == "failed"
    assert s["slow"]["status"] == "failed" and s["slow"]["error"]["kind"] == "TimeoutError"
    assert s["after"]["status"] == "skipped" and s["later"]["status"] == "skipped"
    assert s["free"]["status"] == "succeeded" and s["free"]["result"] == 4


def test_failed_step_error_and_skips(server: Server) -> None:
    body = {
        "steps": [{"id": "bad", "run": "1 / 0"}, {"id": "child", "depends_on": ["bad"], "run": "1"}]
    }
    with server.client() as c:
        wf = run_workflow(c, body)
    s = steps_by_id(wf)
    assert s["bad"]["error"]["kind"] == "ZeroDivisionError" and s["bad"]["attempts"] == 1
    assert s["child"]["status"] == "skipped"
    assert wf["error"]["kind"] == "StepError"


def test_cancel_during_a_step_then_twice(server: Server) -> None:
    body = {
        "steps": [
            {"id": "long", "run": "sleep(20000); 1"},
            {"id": "next", "depends_on": ["long"], "run": "2"},
        ]
    }
    with server.client() as c:
        wf = create(c, body)
        wait_for(c, f"{API}/workflows/{wf['id']}", lambda w: w["steps"][0]["status"] == "running")
        r = c.post(f"{API}/workflows/{wf['id']}/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled"
        s = steps_by_id(r.json())
        assert s["long"]["status"] == "cancelled" and s["next"]["status"] == "skipped"
        again = c.post(f"{API}/workflows/{wf['id']}/cancel")
        assert again.status_code == 409
        # The sandbox worker was stopped: the pool serves the next run at once.
        quick = run_workflow(c, {"steps": [{"id": "q", "run": "41 + 1"}]}, timeout=20)
        assert quick["steps"][0]["result"] == 42
        assert c.get(f"{API}/workflows/{wf['id']}").json()["status"] == "cancelled"


def test_cancel_before_start_skips_pending(server: Server) -> None:
    # The only step waits out a retry backoff: cancelled before its next attempt starts.
    body = {"steps": [{"id": "w", "run": 'throw "no"', "retries": 3, "backoff_s": 30}]}
    with server.client() as c:
        wf = create(c, body)
        wait_for(
            c,
            f"{API}/workflows/{wf['id']}",
            lambda w: w["steps"][0]["attempts"] == 1 and w["steps"][0]["status"] == "pending",
        )
        r = c.post(f"{API}/workflows/{wf['id']}/cancel")
        assert r.status_code == 200
        assert r.json()["steps"][0]["status"] == "skipped"


def test_cancel_after_end_is_409(server: Server) -> None:
    with server.client() as c:
        wf = run_workflow(c, {"steps": [{"id": "a", "run": "1"}]})
        r = c.post(f"{API}/workflows/{wf['id']}/cancel")
        assert r.status_code == 409
        assert c.post(f"{API}/workflows/wf_missing/cancel").status_code == 404


def test_task_step_interpolates_previous_result(server: Server, scripted: ScriptedModel) -> None:
    goal = "Summarise these files: a.txt,b.txt"
    scripted.script(goal, final("two text files"))
    body = {
        "name": "report",
        "inputs": {"sep": ","},
        "steps": [
            {"id": "files", "run": '["a.txt", "b.txt"] | join(inputs.sep)'},
            {
                "id": "summary",
                "depends_on": ["files"],
                "retries": 1,
                "timeout_s": 60,
                "task": {
                    "goal": "Summarise these files: ${steps.files.result}",
                    "tools": ["cat"],
                    "max_steps": 3,
                },
            },
        ],
    }
    with server.client() as c:
        wf = run_workflow(c, body)
        s = steps_by_id(wf)
        assert wf["status"] == "succeeded", wf
        assert s["summary"]["result"] == "two text files"
        task = c.get(f"{API}/tasks/{s['summary']['task_id']}").json()
        assert task["goal"] == goal
    assert scripted.requests_for(goal)


def test_workflow_events_live_and_resumed(server: Server) -> None:
    body = {
        "steps": [{"id": "a", "run": "sleep(300); 1"}, {"id": "b", "depends_on": ["a"], "run": "2"}]
    }
    with server.client() as c:
        wf = create(c, body)
        live = read_sse(c, f"{API}/workflows/{wf['id']}/events")
        names = [e["event"] for e in live]
        assert names[0] == "start" and names[-1] == "complete"
        assert [e["data"]["status"] for e in live if e["event"] == "step"] == [
            "running",
            "succeeded",
            "running",
            "succeeded",
        ]
        ids = [int(e["id"]) for e in live]
        assert ids == sorted(ids)
        resumed = read_sse(
            c, f"{API}/workflows/{wf['id']}/events", headers={"Last-Event-ID": str(ids[2])}
        )
        assert [int(e["id"]) for e in resumed] == ids[3:]
        via_query = read_sse(c, f"{API}/workflows/{wf['id']}/events?last_event_id={ids[-2]}")
        assert [e["event"] for e in via_query] == ["complete"]


def test_each_step_carries_its_definition_as_submitted(server: Server) -> None:
    """GET and list return each step's definition (depends_on, run | task, …) exactly as it
    was submitted, in the submitted order, so a reader can draw the DAG and submit it again."""
    steps = [
        {"id": "b", "run": "1", "retries": 2, "timeout_s": 5},
        {"id": "a", "depends_on": ["b"], "run": "steps.b.result + 1"},
        {
            "id": "t",
            "depends_on": ["a"],
            "task": {"goal": "say ${steps.a.result}", "tools": ["len"], "max_steps": 2},
            "backoff_s": 0.5,
        },
    ]
    body = {"name": "defs", "inputs": {"x": 1}, "steps": steps}
    with server.client() as c:
        wf = create(c, body)
        assert [s["definition"] for s in wf["steps"]] == steps
        got = c.get(f"{API}/workflows/{wf['id']}").json()
        assert [s["id"] for s in got["steps"]] == ["b", "a", "t"]
        assert [s["definition"] for s in got["steps"]] == steps
        listed = next(w for w in c.get(f"{API}/workflows").json() if w["id"] == wf["id"])
        assert [s["definition"] for s in listed["steps"]] == steps
        # The record alone is enough to submit the same workflow again.
        again = create(
            c,
            {
                "name": got["name"],
                "inputs": got["inputs"],
                "steps": [s["definition"] for s in got["steps"]],
            },
        )
        assert [s["definition"] for s in again["steps"]] == steps
        for w in (wf, again):
            c.post(f"{API}/workflows/{w['id']}/cancel")
