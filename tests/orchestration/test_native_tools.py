"""Native tool calls: the agent loop sends the tools as the chat API's ``tools`` and runs the
reply's ``tool_calls`` (several of one turn concurrently) when the model supports tools, and
keeps JSON actions for a model that does not. Against real agent servers and the scripted
model (which speaks the OpenAI protocol: ``test_scripted_model.py``); the kill-and-restart
test runs a real ``conch serve`` process on SQLite and SIGKILLs it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.orchestration.test_checkpoints import checkpoint, positions, started, until
from testsupport.scripted_model import ScriptedModel, call, final, native, tool
from testsupport.servers import Server, finished, start_process_server, wait_for

pytestmark = pytest.mark.timeout(240)

API = "/api/v1/orchestration"
MODEL = "native-tools"  # the scripted model lists "tools" in its capabilities
PLAIN = "plain-chat"  # capabilities without "tools"
REFUSING = "refuses-tools"  # no capabilities listed; a request with tools gets a 400


@pytest.fixture(scope="module")
def net_server(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedModel) -> Any:
    from testsupport.servers import start_thread_server

    scripted.tool_models.add(MODEL)
    scripted.no_tools.add(REFUSING)
    srv = start_thread_server(
        tmp_path_factory.mktemp("native"),
        models_url=scripted.v1,
        wall_time_s=10.0,
        allow_network=True,
        network_allow=["127.0.0.1"],
        thread_sessions=False,  # the thread's calls write the shared workspace, as asserted
    )
    yield srv
    srv.stop()


def create(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json={"model": MODEL, **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def done(c: httpx.Client, task_id: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for(c, f"{API}/tasks/{task_id}", finished, timeout)


def ws(server: Server) -> Path:
    return Path(server.settings.workspace_dir)


def test_native_single_call(net_server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "native: write a note",
        native(call("append", path="native.log", content="hello\n")),
        {"content": "written"},
    )
    with net_server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"]})
        record = done(c, task["id"])
        entries = checkpoint(c, task["id"])
    assert record["status"] == "succeeded" and record["result"] == "written", record
    assert record["protocol"] == "native"
    assert (ws(net_server) / "native.log").read_text() == "hello\n"
    first, second = record["steps"]
    assert first["action"] == "append" and first["args"] == {"path": "native.log", "content": "hello\n"}  # fmt: skip
    assert first["calls"] == [
        {"call_id": "call_0", "tool": "append", "args": first["args"],
         "observation": first["observation"], "error": None},
    ]  # fmt: skip
    assert second["action"] == "final" and second["args"] == {"final": "written"}
    sent = scripted.requests_for(goal)
    assert len(sent) == 2
    # The tools as the API's tools, no response_format.
    assert [t["function"]["name"] for t in sent[0]["tools"]] == ["append"]
    assert sent[0]["tools"][0]["type"] == "function"
    assert sent[0]["tools"][0]["function"]["parameters"]["required"] == ["path", "content"]
    assert sent[0]["tool_choice"] == "auto" and "response_format" not in sent[0]
    # The call and its result go back as an assistant message and a tool message.
    assistant, result = sent[1]["messages"][-2:]
    (made,) = assistant["tool_calls"]
    assert made["function"]["name"] == "append"
    assert json.loads(made["function"]["arguments"]) == first["args"]
    assert result == {"role": "tool", "tool_call_id": made["id"], "content": first["observation"]}
    # The model's reply is checkpointed with its tool calls.
    model = [e["data"] for e in entries if e["kind"] == "model"]
    assert model[0]["tool_calls"] == [
        {"id": made["id"], "name": "append", "arguments": made["function"]["arguments"]}
    ]
    assert "tool_calls" not in model[1]
    # First the server's choice of protocol (the task asked for none), kept until it is
    # final so that a restart before the first answer may still fall back to JSON actions.
    assert [e["kind"] for e in entries] == ["protocol", "model", "call", "result", "model"]
    assert entries[0]["data"] == {"protocol": "native"}


def test_parallel_calls_run_concurrently(net_server: Server, scripted: ScriptedModel) -> None:
    url = scripted.url + "/effects/"
    goal = scripted.script(
        "native: two posts at once",
        native(
            call("http_post", url=url + "par_a?delay_ms=1500", body="a"),
            call("http_post", url=url + "par_b?delay_ms=1500", body="b"),
        ),
        {"content": "both posted"},
    )
    with net_server.client() as c:
        task = create(c, {"goal": goal, "tools": ["http_post"]})
        record = done(c, task["id"])
    assert record["status"] == "succeeded" and record["result"] == "both posted", record
    assert scripted.effects["par_a"] == 1 and scripted.effects["par_b"] == 1
    (a0, a1), (b0, b1) = scripted.effect_spans["par_a"][0], scripted.effect_spans["par_b"][0]
    assert a0 < b1 and b0 < a1, "the two calls did not overlap in time"
    step = record["steps"][0]
    assert [k["call_id"] for k in step["calls"]] == ["call_0_0", "call_0_1"]
    assert all(k["error"] is None for k in step["calls"])
    assert step["action"] == "http_post" and step["observation"] == step["calls"][0]["observation"]
    # Both results went back, one tool message per call, in the calls' order.
    messages = scripted.requests_for(goal)[1]["messages"]
    ids = [k["id"] for k in messages[-3]["tool_calls"]]
    assert [(m["role"], m["tool_call_id"]) for m in messages[-2:]] == [
        ("tool", ids[0]),
        ("tool", ids[1]),
    ]
    assert '"par_a"' in messages[-2]["content"] and '"par_b"' in messages[-1]["content"]
    assert len(record["steps"]) == 2  # one step per model turn


def test_fallback_to_json_on_a_tools_refusal(net_server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "native refused: write a note",
        tool("append", path="fallback.log", content="json\n"),
        final("json done"),
    )
    again = scripted.script("native refused: again", final("still json"))
    with net_server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "model": REFUSING})
        record = done(c, task["id"])
        second = done(c, create(c, {"goal": again, "tools": [], "model": REFUSING})["id"])
    assert record["status"] == "succeeded" and record["result"] == "json done", record
    assert record["protocol"] == "json" and second["protocol"] == "json"
    assert (ws(net_server) / "fallback.log").read_text() == "json\n"
    sent = scripted.requests_for(goal)
    # Refused once with tools, then JSON actions (constrained by the action schema).
    assert "tools" in sent[0] and "response_format" not in sent[0]
    assert all("tools" not in r and "response_format" in r for r in sent[1:])
    assert len(sent) == 3
    # Remembered: the next task on that model asks with JSON actions at once.
    assert ["tools" in r for r in scripted.requests_for(again)] == [False]


def test_protocol_choice(net_server: Server, scripted: ScriptedModel) -> None:
    forced = scripted.script("protocol: forced json", final("forced"))
    plain = scripted.script("protocol: plain model", final("plain"))
    with net_server.client() as c:
        bad = c.post(f"{API}/tasks", json={"goal": "x", "tools": [], "protocol": "xml"})
        assert bad.status_code == 400 and "protocol" in bad.text
        one = create(c, {"goal": forced, "tools": ["append"], "protocol": "json"})
        assert one["protocol"] == "json"  # forced: in the record from the start
        two = create(c, {"goal": plain, "tools": ["append"], "model": PLAIN, "protocol": "auto"})
        one, two = done(c, one["id"]), done(c, two["id"])
    assert (one["protocol"], one["result"]) == ("json", "forced")
    assert (two["protocol"], two["result"]) == ("json", "plain")
    for goal in (forced, plain):
        (req,) = scripted.requests_for(goal)
        assert "tools" not in req and req["response_format"]["type"] == "json_schema"


def test_max_steps_counts_model_turns(net_server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "native: never done",
        native(call("sleep", ms=1), call("sleep", ms=2), call("sleep", ms=3)),
    )
    with net_server.client() as c:
        record = done(c, create(c, {"goal": goal, "tools": ["sleep"], "max_steps": 2})["id"])
    assert record["status"] == "failed" and record["error"]["kind"] == "LimitError", record
    assert len(scripted.requests_for(goal)) == 2
    assert [len(s["calls"]) for s in record["steps"]] == [3, 3]


def test_approve_edit_reject_deny_in_one_turn(net_server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "native: four calls, four fates",
        native(
            call("append", path="approved.log", content="model\n"),
            call("append", path="rejected.log", content="no\n"),
            call("rm", path="keep.txt"),
            call("http_post", url=scripted.url + "/effects/allowed", body="x"),
        ),
        {"content": "decided"},
    )
    (ws(net_server) / "keep.txt").write_text("stays")
    policy = {"effects": {"write": "ask"}, "tools": {"rm": "deny"}}
    with net_server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append", "rm", "http_post"], "approvals": policy})  # fmt: skip
        wait = wait_for(c, f"{API}/tasks/{task['id']}", lambda t: t["status"] == "waiting")
        # Both calls that need a person wait together; the allowed call ran meanwhile.
        assert [(p["call_id"], p["tool"]) for p in wait["pending"]] == [
            ("call_0_0", "append"),
            ("call_0_1", "append"),
        ]
        until(lambda: scripted.effects.get("allowed") == 1)
        url = f"{API}/tasks/{task['id']}"
        assert c.post(f"{url}/approve").status_code == 400  # which one?
        edited = {"path": "approved.log", "content": "person\n"}
        r = c.post(f"{url}/approve", json={"call_id": "call_0_0", "args": edited})
        assert r.status_code == 200 and r.json()["status"] == "waiting", r.text
        r = c.post(f"{url}/reject", json={"call_id": "call_0_1", "message": "not that one"})
        assert r.status_code == 200, r.text
        record = done(c, task["id"])
    assert record["status"] == "succeeded" and record["result"] == "decided", record
    calls = {k["call_id"]: k for k in record["steps"][0]["calls"]}
    assert calls["call_0_0"]["args"] == edited and calls["call_0_0"]["error"] is None
    assert calls["call_0_1"]["error"]["kind"] == "RejectedError"
    assert calls["call_0_2"]["error"]["kind"] == "PermissionError"
    assert calls["call_0_3"]["error"] is None
    assert (ws(net_server) / "approved.log").read_text() == "person\n"
    assert not (ws(net_server) / "rejected.log").exists()
    assert (ws(net_server) / "keep.txt").read_text() == "stays"
    # The allowed call ran once, though the turn stopped and resumed around it; the model
    # was asked twice in all (the turn that waited was not asked again).
    assert scripted.effects["allowed"] == 1
    sent = scripted.requests_for(goal)
    assert len(sent) == 2
    assistant = sent[1]["messages"][-5]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == edited
    tool_messages = [m["content"] for m in sent[1]["messages"][-4:]]
    assert tool_messages[1] == "not that one"
    assert tool_messages[2].startswith("PermissionError: rm was not run")


def test_sigkill_after_a_native_turn(tmp_path: Path, scripted: ScriptedModel) -> None:
    scripted.tool_models.add(MODEL)
    data = tmp_path / "data"
    log = tmp_path / "server.log"
    env = {
        "models_url": scripted.v1,
        "allow_network": "true",
        "network_allow": '["127.0.0.1"]',
        "orchestration_lease_s": "3",
        "workers": "4",  # the three calls of one turn each have a sandbox
    }
    effect_url = scripted.url + "/effects/kill_outside"
    # After a model turn with three calls: one completed, one with an outside effect and
    # one pure call running when the server dies.
    after = scripted.script_by_position(
        "native kill: after a turn",
        native(
            call("append", path="after.log", content="1\n"),
            call("http_post", url=effect_url + "?delay_ms=15000", body="x"),
            call("sleep", ms=6000),
        ),
        {"content": "after done"},
    )
    # Between two model turns: the second is in flight when the server dies.
    between = scripted.script_by_position(
        "native kill: between turns",
        native(call("append", path="between.log", content="1\n")),
        native(call("append", path="between.log", content="2\n"), delay_first=8),
        {"content": "between done"},
    )
    first = start_process_server(data, log, **env)
    try:
        with first.client() as c:
            ids = {
                name: create(c, {"goal": goal, "tools": tools})["id"]
                for name, goal, tools in (
                    ("after", after, ["append", "http_post", "sleep"]),
                    ("between", between, ["append"]),
                )
            }

            def after_ready() -> bool:
                entries = checkpoint(c, ids["after"])
                results = {e["data"]["call_id"] for e in entries if e["kind"] == "result"}
                return results == {"call_0_0"} and started(entries, "call_0_2")

            until(after_ready)
            until(lambda: scripted.effects.get("kill_outside") == 1)
            until(lambda: positions(scripted, between)[1] == 1)
            before = {k: c.get(f"{API}/tasks/{v}").json() for k, v in ids.items()}
        first.kill()
    finally:
        first.stop()
    assert before["after"]["status"] == "running" and before["after"]["steps"] == []
    assert len(before["between"]["steps"]) == 1

    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            rec = {"between": done(c, ids["between"])}
            out = wait_for(c, f"{API}/tasks/{ids['after']}", lambda t: t["status"] == "waiting")
            (pending,) = out["pending"]
            assert pending["call_id"] == "call_0_1" and pending["reason"].startswith("interrupted:")
            r = c.post(f"{API}/tasks/{ids['after']}/reject", json={"message": "skipped"})
            assert r.status_code == 200, r.text
            rec["after"] = done(c, ids["after"])
    finally:
        second.stop()

    w = data / "workspace"
    assert rec["after"]["status"] == "succeeded", rec["after"]
    assert rec["after"]["protocol"] == "native"
    # Nothing that completed ran again: the append once, the outside effect once, the
    # model turn asked once; the pure call that was running was run again.
    assert (w / "after.log").read_text() == "1\n"
    assert scripted.effects["kill_outside"] == 1
    assert positions(scripted, after) == Counter({0: 1, 1: 1})
    calls = {k["call_id"]: k for k in rec["after"]["steps"][0]["calls"]}
    assert calls["call_0_1"]["error"]["kind"] == "RejectedError"
    assert calls["call_0_2"]["error"] is None
    # Between turns: the first call once, the turn in flight asked again.
    assert rec["between"]["status"] == "succeeded", rec["between"]
    assert (w / "between.log").read_text() == "1\n2\n"
    assert positions(scripted, between) == Counter({0: 1, 1: 2, 2: 1})
    assert [s["action"] for s in rec["between"]["steps"]] == ["append", "append", "final"]


def test_a_thread_and_a_fork_of_native_tasks(net_server: Server, scripted: ScriptedModel) -> None:
    """A thread continues a native task's conversation as the model saw it (its tool calls
    and tool messages, its answer as text), and a fork at a native turn with several calls
    asks the model no turn before the fork point and runs no call again."""
    first = scripted.script(
        "native thread: note two things",
        native(
            call("append", path="thread-native.log", content="a\n"),
            call("append", path="thread-native.log", content="b\n"),
        ),
        {"content": "noted both"},
    )
    second = scripted.script("native thread: what did you note?", {"content": "a and b"})
    with net_server.client() as c:
        a = done(c, create(c, {"goal": first, "tools": ["append"], "thread_id": "native-thread"})["id"])  # fmt: skip
        assert a["status"] == "succeeded" and a["protocol"] == "native", a
        b = done(c, create(c, {"goal": second, "tools": ["append"], "thread_id": "native-thread"})["id"])  # fmt: skip
        assert b["status"] == "succeeded" and b["result"] == "a and b", b
        # The fork keeps step 0 (the two calls), its last call's result edited.
        r = c.post(f"{API}/tasks/{a['id']}/fork", json={"checkpoint": 1, "tool_result": "edited"})
        assert r.status_code == 201, r.text
        forked = done(c, r.json()["id"])
    assert (ws(net_server) / "thread-native.log").read_text() in ("a\nb\n", "b\na\n")  # once each
    last_of_a = scripted.requests_for(first)[1]["messages"]  # the first task's second turn
    (b_request,) = scripted.requests_for(second)
    # The thread's history: the first task's messages after its system message, its answer
    # (the calls named by their call ids: the model's own ids are not kept).
    history = b_request["messages"][1:-1]
    assert _no_ids(history) == _no_ids([*last_of_a[1:], {"role": "assistant", "content": "noted both"}])
    assert b_request["messages"][-1] == {"role": "user", "content": second}
    assert [k["id"] for k in history[1]["tool_calls"]] == ["call_0_0", "call_0_1"]
    assert [m["tool_call_id"] for m in history if m["role"] == "tool"] == ["call_0_0", "call_0_1"]
    # The fork: one new model request (its second turn), with the edited last result.
    assert forked["status"] == "succeeded" and forked["protocol"] == "native", forked
    assert len(scripted.requests_for(first)) == 3
    fork_request = scripted.requests_for(first)[-1]["messages"]
    assistant, one, two = fork_request[-3:]
    assert [one["tool_call_id"], two["tool_call_id"]] == [k["id"] for k in assistant["tool_calls"]]
    assert one["content"] != "edited" and two["content"] == "edited"


def _no_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [{**k, "id": None} for k in m["tool_calls"]]
        if "tool_call_id" in m:
            m["tool_call_id"] = None
        out.append(m)
    return out


def test_cli_decides_every_pending_call_at_once(net_server: Server, scripted: ScriptedModel) -> None:
    from tests.orchestration.test_cli import conch

    goal = scripted.script(
        "native: two calls, one command",
        native(call("append", path="one.log", content="1\n"), call("append", path="two.log", content="2\n")),
        {"content": "both"},
    )  # fmt: skip
    with net_server.client() as c:
        task = create(c, {"goal": goal, "tools": ["append"], "approvals": {"effects": {"write": "ask"}}})  # fmt: skip
        wait = wait_for(c, f"{API}/tasks/{task['id']}", lambda t: t["status"] == "waiting")
        assert len(wait["pending"]) == 2
        refused = conch("tasks", "approve", task["id"], "--all", "--args", "{}", "--url", net_server.url)
        assert refused.returncode == 2 and "--call-id" in refused.stderr
        decided = conch("tasks", "approve", task["id"], "--all", "--json", "--url", net_server.url)
        assert decided.returncode == 0, decided.stderr
        assert json.loads(decided.stdout)["pending"] in ([], None)
        record = done(c, task["id"])
    assert record["status"] == "succeeded" and record["result"] == "both", record
    assert (ws(net_server) / "one.log").read_text() == "1\n"
    assert (ws(net_server) / "two.log").read_text() == "2\n"


def test_an_auto_choice_still_falls_back_after_a_restart(tmp_path: Path, scripted: ScriptedModel) -> None:
    """A task that asked for no protocol, chose native tool calls and lost its server before
    the model's first answer may still fall back to JSON actions when it resumes."""
    model = "tools-then-not"
    scripted.tool_models.add(model)
    goal = scripted.script_by_position(
        "auto: chosen, then the server dies",
        {"delay_first": 8, "content": final("answered in json")},
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    env = {"models_url": scripted.v1, "orchestration_lease_s": "3"}
    first = start_process_server(data, log, **env)
    try:
        with first.client() as c:
            task_id = create(c, {"goal": goal, "tools": ["append"], "model": model})["id"]
            until(lambda: positions(scripted, goal)[0] == 1)  # the first turn is in flight
            assert c.get(f"{API}/tasks/{task_id}").json()["protocol"] == "native"
        first.kill()
    finally:
        first.stop()
    scripted.tool_models.discard(model)
    scripted.no_tools.add(model)  # the model now refuses tools
    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            record = done(c, task_id)
            kinds = [e["kind"] for e in checkpoint(c, task_id)]
    finally:
        second.stop()
    assert record["status"] == "succeeded" and record["result"] == "answered in json", record
    assert record["protocol"] == "json"
    assert kinds[0] == "protocol"
    sent = scripted.requests_for(goal)
    assert "tools" in sent[0] and "tools" in sent[1] and "response_format" in sent[-1]
