"""A workflow's agent-task steps across a restart of a real ``conch serve`` process, stopped
with SIGINT (Ctrl-C: a graceful stop) or SIGKILL, while the model server is down as well (as
with ``conch up``, where both stop together and the inference server may come up after the
agent server): the step keeps its task (a waiting one keeps its pending approval, a running
one resumes from its checkpoint), never starts a second one, and a task whose model server
is not up yet asks again with backoff until it is."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import finished, start_process_server, wait_for

pytestmark = pytest.mark.timeout(300)

API = "/api/v1/orchestration"


def step(record: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in record["steps"] if s["id"] == sid)


def step_events(c: httpx.Client, wf_id: str) -> list[tuple[str, str]]:
    out, name = [], ""
    text = c.get(f"{API}/workflows/{wf_id}/events", params={"last_event_id": 0}).text
    for line in text.splitlines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and name == "step":
            data = json.loads(line.split(":", 1)[1])
            out.append((data["id"], data["status"]))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_task_steps_keep_their_tasks_across_a_restart(tmp_path: Path, sig: signal.Signals) -> None:
    model = ScriptedModel().start()
    port = model.port
    ask_goal = model.script_by_position(
        f"restart {sig.name}: write once approved",
        tool("append", path="approved.log", content="x\n"),
        final("written"),
    )
    busy_goal = model.script_by_position(
        f"restart {sig.name}: a slow model",
        tool("len", value=[1, 2, 3]),
        # In flight when the server stops (held the first time only).
        {"delay_first": 120, "content": final("three")},
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    env = {"models_url": model.v1, "model_retry_s": "90"}
    body = {
        "name": "restartable",
        "steps": [
            {"id": "ask", "task": {"goal": ask_goal, "tools": ["append"],
                                   "approvals": {"effects": {"write": "ask"}}}},
            {"id": "busy", "task": {"goal": busy_goal, "tools": ["len"]}},
            {"id": "after", "depends_on": ["ask", "busy"],
             "run": "steps.ask.result + ' ' + steps.busy.result"},
        ],
    }  # fmt: skip
    first = start_process_server(data, log, **env)
    try:
        with first.client() as c:
            r = c.post(f"{API}/workflows", json=body)
            assert r.status_code == 201, r.text
            wf_id = r.json()["id"]
            before = wait_for(
                c, f"{API}/workflows/{wf_id}",
                lambda w: step(w, "ask")["status"] == "waiting" and step(w, "busy").get("task_id"),
            )  # fmt: skip
            ask_task, busy_task = step(before, "ask")["task_id"], step(before, "busy")["task_id"]
            # The slow task's second model request is in flight.
            wait_for(c, f"{API}/tasks/{busy_task}", lambda t: len(t["steps"]) == 1)
            deadline = time.monotonic() + 30
            while len(model.requests_for(busy_goal)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        # The model server goes away too, and is not back when the agent server restarts.
        model.stop()
        assert first.process is not None
        first.process.send_signal(sig)
        first.process.wait(60)
    except BaseException:
        first.stop()
        raise
    if sig == signal.SIGINT:
        assert "Application shutdown complete" in log.read_text() or first.process.returncode == 0

    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            # The step re-attached to its task, which still waits for the same decision.
            shown = wait_for(
                c, f"{API}/workflows/{wf_id}", lambda w: step(w, "ask")["status"] == "waiting"
            )
            assert step(shown, "ask")["task_id"] == ask_task
            # The same attempt, taken up again: it keeps the time it started.
            assert step(shown, "ask")["started_at"] == step(before, "ask")["started_at"]
            waiting = c.get(f"{API}/tasks/{ask_task}").json()
            assert waiting["status"] == "waiting", waiting
            assert [p["tool"] for p in waiting["pending"]] == ["append"]
            # Approved while the model server is still down: the task asks it again, with
            # backoff, rather than failing.
            assert c.post(f"{API}/tasks/{ask_task}/approve").status_code == 200
            time.sleep(2)
            for task_id in (ask_task, busy_task):
                record = c.get(f"{API}/tasks/{task_id}").json()
                assert record["status"] == "running", record
            model.start(port)
            done = wait_for(c, f"{API}/workflows/{wf_id}", finished, 120)
            tasks = [t for t in c.get(f"{API}/tasks").json() if t["goal"] in (ask_goal, busy_goal)]
            ask_record = c.get(f"{API}/tasks/{ask_task}").json()
            events = step_events(c, wf_id)
    finally:
        second.stop()
        model.stop()

    assert done["status"] == "succeeded", done
    assert step(done, "after")["result"] == "written three"
    # One task per step, ever: the ones started before the restart.
    assert step(done, "ask")["task_id"] == ask_task and step(done, "busy")["task_id"] == busy_task
    assert sorted(t["id"] for t in tasks) == sorted([ask_task, busy_task])
    assert step(done, "ask")["attempts"] == 1 and step(done, "busy")["attempts"] == 1
    assert ask_record["result"] == "written" and ask_record["error"] is None
    # The approved call ran once; the slow task's first call was not run again.
    assert (data / "workspace" / "approved.log").read_text() == "x\n"
    assert len(model.requests_for(ask_goal)) == 2
    # The step showed it waits again after the restart.
    waits = [i for i, e in enumerate(events) if e == ("ask", "waiting")]
    assert len(waits) >= 2, events


def test_sigint_gives_a_step_back_without_cancelling_its_task(tmp_path: Path) -> None:
    """The graceful stop alone (no model outage): a waiting step's task is not cancelled."""
    model = ScriptedModel().start()
    goal = model.script_by_position(
        "restart: graceful", tool("append", path="g.log", content="y\n"), final("ok")
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    first = start_process_server(data, log, models_url=model.v1)
    try:
        with first.client() as c:
            wf_id = c.post(f"{API}/workflows", json={"steps": [
                {"id": "t", "task": {"goal": goal, "tools": ["append"],
                                     "approvals": {"effects": {"write": "ask"}}}},
            ]}).json()["id"]  # fmt: skip
            task_id = wait_for(
                c, f"{API}/workflows/{wf_id}", lambda w: step(w, "t")["status"] == "waiting"
            )["steps"][0]["task_id"]
        assert first.process is not None
        first.process.send_signal(signal.SIGINT)
        try:
            first.process.wait(60)
        except subprocess.TimeoutExpired:
            first.stop()
            raise
        second = start_process_server(data, log, models_url=model.v1)
        try:
            with second.client() as c:
                assert c.get(f"{API}/tasks/{task_id}").json()["status"] == "waiting"
                wait_for(
                    c, f"{API}/workflows/{wf_id}", lambda w: step(w, "t")["status"] == "waiting"
                )
                assert c.post(f"{API}/tasks/{task_id}/approve").status_code == 200
                done = wait_for(c, f"{API}/workflows/{wf_id}", finished, 60)
        finally:
            second.stop()
    finally:
        first.stop()
        model.stop()
    assert done["status"] == "succeeded" and done["steps"][0]["result"] == "ok", done
    assert done["steps"][0]["task_id"] == task_id
