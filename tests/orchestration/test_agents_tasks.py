"""Agents and tasks over HTTP against a real agent server and the scripted model server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from conch.orchestration.protocols import action_schema
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, finished, wait_for

API = "/api/v1/orchestration"


def run_task(c: httpx.Client, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json=body)
    assert r.status_code == 201, r.text
    record = r.json()
    for key in ("id", "goal", "tools", "max_steps", "agent", "status", "steps", "result", "error",
                "created_at", "started_at", "finished_at", "duration_ms", "usage"):  # fmt: skip
        assert key in record
    assert record["status"] in ("pending", "running")
    return wait_for(c, f"{API}/tasks/{record['id']}", finished, timeout)


def test_default_agent_listed(server: Server) -> None:
    with server.client() as c:
        agents = c.get(f"{API}/agents").json()
    assert isinstance(agents, list)
    default = next(a for a in agents if a["id"] == "default")
    assert default["status"] == "idle"
    assert default["model"] == "local:smollm2-135m-instruct"
    assert "ls" in default["capabilities"] and "cat" in default["capabilities"]
    assert "rm" not in default["capabilities"]  # write effect: not for the default agent
    assert set(default) >= {"id", "status", "capabilities", "model", "description"}


def test_register_get_delete_agent(server: Server) -> None:
    with server.client() as c:
        r = c.post(
            f"{API}/agents",
            json={
                "id": "counter",
                "system_prompt": "Count things.",
                "tools": ["len"],
                "model": "local:x",
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["capabilities"] == ["len"]
        assert c.get(f"{API}/agents/counter").json()["model"] == "local:x"
        assert any(a["id"] == "counter" for a in c.get(f"{API}/agents").json())
        bad = c.post(f"{API}/agents", json={"id": "x", "system_prompt": "", "tools": ["nope"]})
        assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
        assert c.post(f"{API}/agents", json={"id": "x", "tools": [], "extra": 1}).status_code == 400
        assert c.delete(f"{API}/agents/counter").status_code == 200
        assert c.get(f"{API}/agents/counter").status_code == 404
        assert c.delete(f"{API}/agents/counter").status_code == 404
        assert c.delete(f"{API}/agents/default").status_code == 409


def test_two_tool_run(server: Server, scripted: ScriptedModel) -> None:
    (server.settings.workspace_dir / "notes.txt").write_text("a\nb\n")
    goal = scripted.script(
        "how many entries in the workspace",
        tool("ls", path="."),
        tool("len", value=[1, 2, 3]),
        final("3 entries"),
    )
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["ls", "len"], "max_steps": 5})
    assert record["status"] == "succeeded", record
    assert record["result"] == "3 entries"
    steps = record["steps"]
    assert [s["action"] for s in steps] == ["ls", "len", "final"]
    assert [s["index"] for s in steps] == [0, 1, 2]
    assert "notes.txt" in steps[0]["observation"]
    assert steps[1]["observation"] == "3"
    for s in steps:
        assert set(s) >= {"index", "action", "args", "observation", "elapsed_ms", "usage"}
    assert record["usage"]["total_tokens"] == 45
    assert record["duration_ms"] >= 0


def test_schema_echo(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("echo the schema", final("ok"))
    with server.client() as c:
        run_task(c, {"goal": goal, "tools": ["cat", "len"], "max_steps": 2, "model": "local:tiny"})
    request = scripted.requests_for(goal)[0]
    assert request["model"] == "tiny"  # the local: prefix is conch's own
    fmt = request["response_format"]
    assert fmt["type"] == "json_schema"
    schema = fmt["json_schema"]["schema"]
    assert schema == action_schema(["cat", "len"])
    names = [v["properties"].get("tool", {}).get("const") for v in schema["anyOf"]]
    assert names == ["cat", "len", None]
    cat_args = schema["anyOf"][0]["properties"]["args"]
    assert "path" in cat_args["properties"] and cat_args["required"] == ["path"]
    jsonschema.validate({"tool": "cat", "args": {"path": "x"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool": "rm", "args": {}}, schema)


def test_malformed_json_then_recovery(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "recover from garbage",
        "Sure! I will call {tool: len",  # not JSON: corrective retry
        "```json\n" + tool("len", value=[1]) + "\n```",  # fenced: the lenient parser takes it
        final("one"),
    )
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["len"], "max_steps": 4})
    assert record["status"] == "succeeded", record
    assert [s["action"] for s in record["steps"]] == ["len", "final"]
    retry = scripted.requests_for(goal)[1]["messages"]
    assert "not a valid action" in retry[-1]["content"]


def test_malformed_twice_fails_typed(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("always garbage", "no json here")
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["len"], "max_steps": 4})
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "ProviderError"


def test_unknown_tool_at_creation_is_400(server: Server) -> None:
    with server.client() as c:
        r = c.post(
            f"{API}/tasks", json={"goal": "x", "tools": ["ls", "no_such_tool"], "max_steps": 3}
        )
        assert r.status_code == 400
        assert "no_such_tool" in r.json()["error"]["message"]
        assert c.post(f"{API}/tasks", json={"goal": "x", "max_steps": 0}).status_code == 400
        assert c.post(f"{API}/tasks", json={"tools": []}).status_code == 400
        assert c.post(f"{API}/tasks", json={"goal": "x", "bogus": 1}).status_code == 400
        assert c.post(f"{API}/tasks", content=b"{not json").status_code == 400
        assert c.post(f"{API}/tasks", json={"goal": "x", "agent": "ghost"}).status_code == 400


def test_model_calls_unknown_tool(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("use a tool you do not have", tool("rm", path="x"), final("gave up"))
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
    assert record["status"] == "succeeded"
    first = record["steps"][0]
    assert first["action"] == "rm" and first["error"]["kind"] == "NameError"
    assert "unknown tool" in first["observation"]


def test_too_many_steps_is_limit_error(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("loop forever", tool("len", value=[1]))
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "LimitError"
    assert len(record["steps"]) == 3


def test_tool_that_raises(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("read a missing file", tool("cat", path="missing.txt"), final("no file"))
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["cat"], "max_steps": 3})
    assert record["status"] == "succeeded"
    step = record["steps"][0]
    assert step["error"]["kind"] == "FileNotFoundError"
    assert step["observation"].startswith("FileNotFoundError")


def test_tool_that_times_out(server: Server, scripted: ScriptedModel) -> None:
    # The server's wall time is 5 s (conftest); sleep takes milliseconds.
    goal = scripted.script("sleep too long", tool("sleep", ms=60_000), final("woke"))
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["sleep"], "max_steps": 3}, timeout=60)
    assert record["status"] == "succeeded"
    assert record["steps"][0]["error"]["kind"] == "TimeoutError"


def test_observation_truncated(make_server: Any, scripted: ScriptedModel) -> None:
    srv = make_server(agent_observation_chars=10)
    goal = scripted.script("long output", tool("repeat", value="abc", n=100), final("ok"))
    with srv.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["repeat"], "max_steps": 3})
    obs = record["steps"][0]["observation"]
    assert obs.startswith("abcabcabca") and "truncated" in obs


def test_cancel_task(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("slow model", {"delay": 30, "content": final("late")})
    with server.client() as c:
        created = c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).json()
        busy = {a["id"]: a["status"] for a in c.get(f"{API}/agents").json()}
        assert busy["default"] == "busy"
        r = c.post(f"{API}/tasks/{created['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert c.post(f"{API}/tasks/{created['id']}/cancel").status_code == 409
        assert c.get(f"{API}/tasks/{created['id']}").json()["status"] == "cancelled"
        assert c.post(f"{API}/tasks/task_nope/cancel").status_code == 404
        listed = c.get(f"{API}/tasks").json()
        assert any(t["id"] == created["id"] for t in listed)


def test_task_events_join_and_resume(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("stream me", tool("len", value=[1, 2]), final("two"))
    with server.client() as c:
        record = run_task(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        events = read_sse(c, f"{API}/tasks/{record['id']}/events")
        assert [e["event"] for e in events] == ["start", "step", "step", "complete"]
        assert [e["id"] for e in events] == ["1", "2", "3", "4"]
        assert events[-1]["data"]["result"] == "two"
        resumed = read_sse(c, f"{API}/tasks/{record['id']}/events", headers={"Last-Event-ID": "2"})
        assert [e["id"] for e in resumed] == ["3", "4"]


def test_metrics_route_and_prometheus(server: Server) -> None:
    with server.client() as c:
        m = c.get(f"{API}/metrics").json()
        text = c.get("/metrics").text
    for key in ("total_agents", "active_tasks", "completed_tasks", "avg_task_duration_ms",
                "failed_tasks", "cancelled_tasks", "total_workflows", "running_workflows"):  # fmt: skip
        assert isinstance(m[key], int)
    assert m["total_agents"] >= 1
    assert "conch_orchestration_completed_tasks" in text
    assert "conch_orchestration_active_tasks" in text


def read_sse(c: httpx.Client, path: str, **kw: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with c.stream("GET", path, **kw) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        for line in resp.iter_lines():
            if not line:
                if current:
                    events.append(current)
                    current = {}
                continue
            key, _, value = line.partition(": ")
            current[key if key != "data" else "data"] = (
                json.loads(value) if key == "data" else value
            )
    if current:
        events.append(current)
    return events


def test_agent_builtin_in_the_server_records_a_task(
    server: Server, scripted: ScriptedModel
) -> None:
    goal = scripted.script("builtin agent goal", tool("len", value=[1, 2, 3, 4]), final("four"))
    code = f'agent({{goal: "{goal}", tools: ["len"], max_steps: 3}})'
    with server.client() as c:
        r = c.post("/api/v1/eval", json={"code": code})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["success"], body
        value = body["value"]
        assert value["status"] == "succeeded" and value["result"] == "four"
        assert [s["action"] for s in value["steps"]] == ["len", "final"]
        assert value["steps"][0]["observation"] == "4"
        record = c.get(f"{API}/tasks/{value['id']}").json()
    assert record["status"] == "succeeded" and record["result"] == "four"
    assert len(record["steps"]) == 2
