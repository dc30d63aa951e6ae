"""Approvals over HTTP against a real agent server and the scripted model: a tool call the
task's policy says ``ask`` for stops the task (``waiting``) until it is approved (perhaps
with edited arguments), rejected (the model sees the message), or times out; ``deny`` is an
error the model sees; policies come from the server, the agent, the task, a workflow step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, finished, wait_for

API = "/api/v1/orchestration"
ASK_WRITE = {"effects": {"write": "ask"}}


def create(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def waiting(c: httpx.Client, task_id: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(c, f"{API}/tasks/{task_id}", lambda t: t["status"] == "waiting", timeout)


def done(c: httpx.Client, task_id: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(c, f"{API}/tasks/{task_id}", finished, timeout)


def events(c: httpx.Client, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event of a finished run (the stream replays them and ends)."""
    out: list[tuple[str, dict[str, Any]]] = []
    name = ""
    for line in c.get(f"{API}/{stream}/events").text.splitlines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            out.append((name, json.loads(line.split(":", 1)[1])))
    return out


def workspace(server: Server) -> Path:
    return Path(server.settings.workspace_dir)


def test_approve_runs_the_call_once(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "approve: write a note", tool("append", path="approve.log", content="hello\n"),
        final("noted"),
    )  # fmt: skip
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "approvals": ASK_WRITE})
        assert task["approvals"] == ASK_WRITE
        wait = waiting(c, task["id"])
        assert wait["pending"] == [
            {
                "call_id": "call_0",
                "tool": "append",
                "args": {"path": "approve.log", "content": "hello\n"},
                "effect": "write",
                "reason": "the approval policy says 'ask' for the effect 'write' (of 'append')",
            }
        ]
        assert wait["steps"] == [] and not (workspace(server) / "approve.log").exists()
        assert len(scripted.requests_for(goal)) == 1
        r = c.post(f"{API}/tasks/{task['id']}/approve")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running" and r.json()["pending"] == []
        record = done(c, task["id"])
        assert record["status"] == "succeeded" and record["result"] == "noted"
        assert record["steps"][0]["args"] == {"path": "approve.log", "content": "hello\n"}
        assert (workspace(server) / "approve.log").read_text() == "hello\n"
        # The model was not asked again for the turn that waited: two requests in all.
        assert len(scripted.requests_for(goal)) == 2
        names = [name for name, _ in events(c, f"tasks/{task['id']}")]
        assert names == ["start", "interrupt", "resume", "step", "step", "complete"]
        kinds = [e["kind"] for e in c.get(f"{API}/tasks/{task['id']}/checkpoint").json()]
        assert kinds == ["model", "ask", "decision", "call", "result", "model"]
        # Decided once: a second decision is a conflict.
        again = c.post(f"{API}/tasks/{task['id']}/approve")
        assert again.status_code == 409 and again.json()["error"]["kind"] == "Conflict"


def test_approve_with_edited_args(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "approve edited: write a note", tool("append", path="model.log", content="model\n"),
        final("noted"),
    )  # fmt: skip
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "approvals": ASK_WRITE})
        waiting(c, task["id"])
        url = f"{API}/tasks/{task['id']}/approve"
        bad = c.post(url, json={"args": {"path": "x.log", "nope": 1}})
        assert bad.status_code == 400 and bad.json()["error"]["where"] == "args.nope"
        bad = c.post(url, json={"args": {"path": 5, "content": "x"}})
        assert bad.status_code == 400 and bad.json()["error"]["where"] == "args.path"
        bad = c.post(url, json={"args": {"content": "x"}})
        assert bad.status_code == 400 and bad.json()["error"]["where"] == "args.path"
        bad = c.post(url, json={"args": {"path": "x.log", "content": "x"}, "call_id": "call_9"})
        assert bad.status_code == 400 and bad.json()["error"]["where"] == "call_id"
        bad = c.post(url, json={"args": {"path": "x.log", "content": "x"}, "extra": 1})
        assert bad.status_code == 400
        assert c.get(f"{API}/tasks/{task['id']}").json()["status"] == "waiting"
        edited = {"path": "person.log", "content": "person\n"}
        r = c.post(url, json={"args": edited, "call_id": "call_0"})
        assert r.status_code == 200, r.text
        record = done(c, task["id"])
    assert record["status"] == "succeeded"
    assert record["steps"][0]["args"] == edited
    assert (workspace(server) / "person.log").read_text() == "person\n"
    assert not (workspace(server) / "model.log").exists()
    # The conversation shows the call as it ran.
    last = scripted.requests_for(goal)[-1]["messages"]
    assert json.loads(last[-2]["content"]) == {"tool": "append", "args": edited}


def test_reject_with_message(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "reject: remove a file", tool("rm", path="keep.txt"), final("left it"),
    )  # fmt: skip
    (workspace(server) / "keep.txt").write_text("precious")
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["rm"], "approvals": ASK_WRITE})
        waiting(c, task["id"])
        r = c.post(f"{API}/tasks/{task['id']}/reject", json={"message": "not that file"})
        assert r.status_code == 200, r.text
        record = done(c, task["id"])
        resume = [d for name, d in events(c, f"tasks/{task['id']}") if name == "resume"]
    assert record["status"] == "succeeded" and record["result"] == "left it"
    assert record["steps"][0]["observation"] == "not that file"
    assert record["steps"][0]["error"]["kind"] == "RejectedError"
    assert (workspace(server) / "keep.txt").read_text() == "precious"
    assert scripted.requests_for(goal)[-1]["messages"][-1]["content"] == (
        "Observation: not that file"
    )
    assert resume[0]["reason"] == "rejected" and resume[0]["message"] == "not that file"


def test_deny_is_an_error_the_model_sees(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "deny: remove a file", tool("rm", path="stays.txt"), final("could not"),
    )  # fmt: skip
    (workspace(server) / "stays.txt").write_text("here")
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["rm"], "approvals": {"tools": {"rm": "deny"}}})
        record = done(c, task["id"])
        names = [name for name, _ in events(c, f"tasks/{task['id']}")]
    assert record["status"] == "succeeded"
    step = record["steps"][0]
    assert step["error"]["kind"] == "PermissionError"
    assert step["observation"].startswith("PermissionError: rm was not run")
    assert (workspace(server) / "stays.txt").read_text() == "here"
    assert "interrupt" not in names


def test_timeout_rejects(make_server: Any, scripted: ScriptedModel) -> None:
    srv = make_server(orchestration_lease_s=1.5)
    goal = scripted.script(
        "timeout: write a note", tool("append", path="late.log", content="x\n"),
        final("nobody answered"),
    )  # fmt: skip
    with srv.client() as c:
        task = create(
            c, {"goal": goal, "tools": ["append"], "approvals": ASK_WRITE,
                "approval_timeout_s": 1},
        )  # fmt: skip
        wait = waiting(c, task["id"])
        assert wait["approval_timeout_s"] == 1 and wait["approval_deadline"] is not None
        record = done(c, task["id"], 30)
        resume = [d for name, d in events(c, f"tasks/{task['id']}") if name == "resume"]
    assert record["status"] == "succeeded" and record["result"] == "nobody answered"
    assert record["steps"][0]["error"]["kind"] == "RejectedError"
    assert "approval timeout" in record["steps"][0]["observation"]
    assert resume[0]["reason"] == "timeout" and resume[0]["by"] == "timeout"
    assert not (Path(srv.settings.workspace_dir) / "late.log").exists()


def test_errors(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("errors: answer", final("at once"))
    with server.client() as c:
        missing = c.post(f"{API}/tasks/task_missing/approve")
        assert missing.status_code == 404 and missing.json()["error"]["kind"] == "NotFound"
        assert c.post(f"{API}/tasks/task_missing/reject").status_code == 404
        task = create(c, {"goal": goal, "tools": [], "approvals": ASK_WRITE})
        done(c, task["id"])
        assert c.post(f"{API}/tasks/{task['id']}/approve").status_code == 409
        assert c.post(f"{API}/tasks/{task['id']}/reject", json={"message": "x"}).status_code == 409
        bad = c.post(
            f"{API}/tasks",
            json={"goal": "x", "tools": [], "approvals": {"effects": {"disk": "ask"}}},
        )
        assert bad.status_code == 400 and "disk" in bad.text
        bad = c.post(
            f"{API}/tasks", json={"goal": "x", "tools": [], "approvals": {"tools": {"nope": "ask"}}}
        )
        assert bad.status_code == 400 and "nope" in bad.text
        bad = c.post(f"{API}/tasks", json={"goal": "x", "approvals": {"default": "maybe"}})
        assert bad.status_code == 400


def test_cancel_a_waiting_task(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "cancel waiting", tool("append", path="never.log", content="x"), final("no"),
    )  # fmt: skip
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "approvals": ASK_WRITE})
        waiting(c, task["id"])
        r = c.post(f"{API}/tasks/{task['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert r.json()["pending"] == []
        assert c.post(f"{API}/tasks/{task['id']}/approve").status_code == 409
    assert not (workspace(server) / "never.log").exists()


def test_agent_and_server_policies(make_server: Any, scripted: ScriptedModel) -> None:
    # The server denies every write; an agent asks for append; a task allows it outright.
    srv = make_server(approvals={"effects": {"write": "deny"}})
    goals = [
        scripted.script(f"layers {n}: write", tool("append", path="layers.log", content="x\n"),
                        final("ok"))
        for n in range(3)
    ]  # fmt: skip
    with srv.client() as c:
        r = c.post(
            f"{API}/agents",
            json={"id": "careful", "tools": ["append"], "approvals": {"tools": {"append": "ask"}}},
        )
        assert r.status_code == 201, r.text
        assert r.json()["approvals"] == {"tools": {"append": "ask"}}
        denied = done(c, create(c, {"goal": goals[0], "tools": ["append"]})["id"])
        assert denied["steps"][0]["error"]["kind"] == "PermissionError"
        asked = create(c, {"goal": goals[1], "agent": "careful"})
        assert asked["approvals"] == {"effects": {"write": "deny"}, "tools": {"append": "ask"}}
        waiting(c, asked["id"])
        c.post(f"{API}/tasks/{asked['id']}/approve")
        assert done(c, asked["id"])["steps"][0]["error"] is None
        allowed = create(
            c, {"goal": goals[2], "agent": "careful", "approvals": {"tools": {"append": "allow"}}}
        )
        assert done(c, allowed["id"])["steps"][0]["error"] is None
    assert (Path(srv.settings.workspace_dir) / "layers.log").read_text() == "x\nx\n"


def test_workflow_step_waits(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "workflow: write 7", tool("append", path="wf.log", content="7\n"), final("7"),
    )  # fmt: skip
    body = {
        "steps": [
            {"id": "n", "run": "7"},
            {"id": "agent", "depends_on": ["n"],
             "task": {"goal": "workflow: write ${steps.n.result}", "tools": ["append"],
                      "approvals": ASK_WRITE}},
            {"id": "after", "depends_on": ["agent"], "run": "steps.agent.result + '!'"},
        ]
    }  # fmt: skip
    with server.client() as c:
        wf = c.post(f"{API}/workflows", json=body)
        assert wf.status_code == 201, wf.text
        wf_id = wf.json()["id"]
        shown = wait_for(
            c, f"{API}/workflows/{wf_id}", lambda w: w["steps"][1]["status"] == "waiting"
        )
        assert shown["status"] == "running"
        task_id = shown["steps"][1]["task_id"]
        assert c.get(f"{API}/tasks/{task_id}").json()["status"] == "waiting"
        assert c.post(f"{API}/tasks/{task_id}/approve").status_code == 200
        record = wait_for(c, f"{API}/workflows/{wf_id}", finished)
        step_events = [
            (d["id"], d["status"]) for name, d in events(c, f"workflows/{wf_id}") if name == "step"
        ]
    assert record["status"] == "succeeded", record
    assert record["steps"][2]["result"] == "7!"
    assert ("agent", "waiting") in step_events
    assert step_events.index(("agent", "waiting")) < step_events.index(("agent", "succeeded"))
    assert (workspace(server) / "wf.log").read_text() == "7\n"
    assert goal  # the goal the step's task was given


def test_openapi_describes_the_task_record(server: Server) -> None:
    with server.client() as c:
        doc = c.get("/api-docs/openapi.json").json()
    validate(doc)
    op = doc["paths"]["/api/v1/orchestration/tasks/{task_id}"]["get"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    record = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"pending", "approvals", "approval_timeout_s", "approval_deadline"} <= set(
        record["properties"]
    )
    assert "waiting" in record["properties"]["status"]["enum"]
    paths = doc["paths"]
    assert "post" in paths["/api/v1/orchestration/tasks/{task_id}/approve"]
    assert "post" in paths["/api/v1/orchestration/tasks/{task_id}/reject"]
    create_body = paths["/api/v1/orchestration/tasks"]["post"]["requestBody"]
    schema = create_body["content"]["application/json"]["schema"]
    assert {"approvals", "approval_timeout_s"} <= set(schema["properties"])


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_cli_approve_and_reject(server: Server, scripted: ScriptedModel, decision: str) -> None:
    from tests.orchestration.test_cli import conch

    goal = scripted.script(
        f"cli {decision}", tool("append", path=f"cli-{decision}.log", content="model\n"),
        final("ok"),
    )  # fmt: skip
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "approvals": ASK_WRITE})
        waiting(c, task["id"])
        shown = conch("tasks", "show", task["id"], "--url", server.url)
        assert "waiting: call_0 append" in shown.stdout
        if decision == "approve":
            args = json.dumps({"path": "cli-approve.log", "content": "cli\n"})
            bad = conch(
                "tasks", "approve", task["id"], "--args", '{"nope": 1}', "--url", server.url
            )
            assert bad.returncode == 1 and "400" in bad.stderr and "nope" in bad.stderr
            out = conch(
                "tasks", "approve", task["id"], "--args", args, "--url", server.url, "--json"
            )
        else:
            out = conch("tasks", "reject", task["id"], "--message", "no thanks", "--url", server.url, "--json")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["status"] == "running"
        record = done(c, task["id"])
        again = conch("tasks", decision, task["id"], "--url", server.url)
        assert again.returncode == 1 and "409" in again.stderr
    log = workspace(server) / f"cli-{decision}.log"
    if decision == "approve":
        assert log.read_text() == "cli\n"
    else:
        assert not log.exists()
        assert record["steps"][0]["observation"] == "no thanks"
