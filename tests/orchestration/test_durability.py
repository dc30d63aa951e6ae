"""Durability: a real ``conch serve`` process killed with SIGKILL mid-workflow, restarted on
the same database; the workflow resumes and every step runs once (or within its attempts),
and the agent task resumes from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import finished, start_process_server, wait_for

pytestmark = pytest.mark.timeout(240)

API = "/api/v1/orchestration"


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_mid_workflow_then_resume(tmp_path: Path, scripted: ScriptedModel) -> None:
    data = tmp_path / "data"
    log = tmp_path / "server.log"
    env = {"models_url": scripted.v1}
    goal = scripted.script(
        "a task that outlives its server",
        {"delay": 60, "content": final("late")},
        final("resumed"),
    )
    agent_goal = scripted.script_by_position(
        "a workflow's task that outlives its server",
        tool("append", path="agent.log", content="x\n"),
        {"delay_first": 60, "content": final("agent done")},
    )
    first = start_process_server(data, log, **env)
    body = {
        "name": "durable",
        "steps": [
            {"id": "a", "run": 'append("a.log", "x\\n"); 1'},
            {
                "id": "b",
                "depends_on": ["a"],
                "retries": 1,
                "run": 'append("b-start.log", "x\\n"); sleep(3000); append("b.log", "x\\n"); steps.a.result + 1',
            },
            {"id": "c", "depends_on": ["b"], "run": 'append("c.log", "x\\n"); steps.b.result + 1'},
            {"id": "side", "run": 'append("side.log", "x\\n"); "side"'},
            # An agent task step (no retries): its task lives on, and the step waits for it.
            {"id": "agent", "task": {"goal": agent_goal, "tools": ["append"]}},
        ],
    }
    try:
        with first.client() as c:
            wf = c.post(f"{API}/workflows", json=body).json()
            task = c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).json()
            wait_for(
                c, f"{API}/workflows/{wf['id']}", lambda w: w["steps"][1]["status"] == "running", 60
            )
            wait_for(c, f"{API}/tasks/{task['id']}", lambda t: t["status"] == "running", 30)
            agent_step = wait_for(
                c, f"{API}/workflows/{wf['id']}", lambda w: w["steps"][4].get("task_id"), 30
            )["steps"][4]
            wait_for(c, f"{API}/tasks/{agent_step['task_id']}", lambda t: len(t["steps"]) == 1, 30)
        first.kill()
    finally:
        first.stop()

    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            done = wait_for(c, f"{API}/workflows/{wf['id']}", finished, 90)
            resumed = wait_for(c, f"{API}/tasks/{task['id']}", finished, 60)
            agent_tasks = [t for t in c.get(f"{API}/tasks").json() if t["goal"] == agent_goal]
    finally:
        second.stop()

    assert done["status"] == "succeeded", done
    steps = {s["id"]: s for s in done["steps"]}
    assert steps["c"]["result"] == 3
    assert steps["a"]["attempts"] == 1 and steps["c"]["attempts"] == 1
    assert steps["b"]["attempts"] == 2  # interrupted once, retried within its attempts
    ws = data / "workspace"
    assert lines(ws / "a.log") == 1 and lines(ws / "c.log") == 1 and lines(ws / "side.log") == 1
    assert lines(ws / "b-start.log") == 2
    # The task resumed from its checkpoint: its one model request had not been answered
    # when the server died, so it was asked again (and answered at once this time).
    assert resumed["status"] == "succeeded", resumed
    assert resumed["result"] == "resumed"
    assert len(scripted.requests_for(goal)) == 2
    # The task step: the same task, resumed (its first call not run again), one attempt.
    assert steps["agent"]["status"] == "succeeded" and steps["agent"]["result"] == "agent done"
    assert steps["agent"]["attempts"] == 1
    assert steps["agent"]["task_id"] == agent_step["task_id"]
    assert [t["id"] for t in agent_tasks] == [agent_step["task_id"]]
    assert lines(ws / "agent.log") == 1
