"""Forks and threads of agent tasks, against a stand-in model server (OpenAI chat protocol on
loopback) whose requests are counted: a fork starts from a task's checkpoint without asking
the model again for a turn before the fork point or running a kept tool call again (the
tools' side effects, lines appended to workspace files, are counted); a thread's tasks
continue one conversation. On SQLite (one in-process server) and on a real PostgreSQL with
two ``conch serve`` processes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.orchestration.pg import postgres_cluster
from tests.orchestration.test_cli import conch
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, finished, start_process_server, wait_for

API = "/api/v1/orchestration"


def create(c: httpx.Client, goal: str, tools: list[str], **extra: Any) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json={"goal": goal, "tools": tools, **extra})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def fork(c: httpx.Client, task_id: str, **body: Any) -> httpx.Response:
    return c.post(f"{API}/tasks/{task_id}/fork", json=body)


def done(c: httpx.Client, task_id: str) -> dict[str, Any]:
    return wait_for(c, f"{API}/tasks/{task_id}", finished, 60)


def checkpoint(c: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    r = c.get(f"{API}/tasks/{task_id}/checkpoint")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def conversation(request: dict[str, Any]) -> list[tuple[str, str]]:
    """A model request's messages after the system message, as (role, content)."""
    messages = request["messages"]
    assert messages[0]["role"] == "system"
    return [(m["role"], m["content"]) for m in messages[1:]]


def action(reply: str) -> tuple[str, str]:
    return ("assistant", json.dumps(json.loads(reply), ensure_ascii=False))


def test_fork_keeps_steps_without_asking_or_running_them_again(
    server: Server, scripted: ScriptedModel
) -> None:
    ws = server.settings.workspace_dir
    one = tool("append", path="fork.log", content="1\n")
    two = tool("append", path="fork.log", content="2\n")
    # By turn: the original takes turns 0-2 (turn 0 is prose, answered by a corrective
    # retry); turn 4 is the fork that adds no message.
    goal = scripted.script(
        "fork: count to two", "Let me think.", one, two, final("two"), final("fork without message")
    )
    message = scripted.script("fork: the file was edited, count again", final("edited: three"))
    with server.client() as c:
        original = done(c, create(c, goal, ["append"], max_steps=5)["id"])
        assert original["status"] == "succeeded", original
        assert [s["action"] for s in original["steps"]] == ["append", "append", "final"]
        assert (ws / "fork.log").read_text() == "1\n2\n"
        asked = len(scripted.requests_for(goal))
        assert asked == 4
        entries = checkpoint(c, original["id"])

        # Keep steps 0 and 1, tell the model the second call came to something else, and add
        # a message.
        r = fork(c, original["id"], checkpoint=2, tool_result="3 lines", message=message)
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["forked_from"] == original["id"] and made["fork_checkpoint"] == 2
        assert made["thread_id"] is None and made["goal"] == goal
        assert [s["index"] for s in made["steps"]] == [0, 1]
        forked = done(c, made["id"])
        assert forked["status"] == "succeeded", forked
        assert forked["result"] == "edited: three"
        assert [s["action"] for s in forked["steps"]] == ["append", "append", "final"]
        assert forked["steps"][0] == original["steps"][0]
        assert forked["steps"][1]["observation"] == "3 lines"
        # Nothing before the fork point was asked or run again: one new request, under the
        # added message, holding the kept conversation.
        assert len(scripted.requests_for(goal)) == asked
        (new,) = scripted.requests_for(message)
        assert conversation(new) == [
            ("user", goal),
            action(one),
            ("user", f"Observation: {original['steps'][0]['observation']}"),
            action(two),
            ("user", "Observation: 3 lines"),
            ("user", message),
        ]
        assert (ws / "fork.log").read_text() == "1\n2\n"
        kinds = [(e["kind"], e["data"].get("turn", e["data"].get("call_id"))) for e in checkpoint(c, made["id"])]
        assert kinds == [
            ("model", 0), ("model", 1), ("call", "call_0"), ("result", "call_0"),
            ("model", 2), ("call", "call_1"), ("result", "call_1"), ("message", None),
            ("model", 3),
        ]  # fmt: skip
        edited = [e["data"] for e in checkpoint(c, made["id"]) if e["kind"] == "result"][1]
        assert edited["observation"] == "3 lines" and edited["edited"] is True
        # The original is as it was.
        assert c.get(f"{API}/tasks/{original['id']}").json() == original
        assert checkpoint(c, original["id"]) == entries

        # No message: the fork's next request is the original goal's next turn.
        r = fork(c, original["id"], checkpoint=1)
        assert r.status_code == 201, r.text
        plain = done(c, r.json()["id"])
        assert plain["status"] == "succeeded" and plain["result"] == "fork without message"
        assert [s["action"] for s in plain["steps"]] == ["append", "final"]
        last = scripted.requests_for(goal)[-1]
        assert len(scripted.requests_for(goal)) == asked + 1
        assert conversation(last) == [
            ("user", goal),
            action(one),
            ("user", f"Observation: {original['steps'][0]['observation']}"),
        ]
        assert (ws / "fork.log").read_text() == "1\n2\n"

        # A fork of a fork keeps the edited result.
        again = scripted.script("fork: of a fork", final("fork of fork"))
        r = fork(c, forked["id"], checkpoint=2, message=again)
        assert r.status_code == 201, r.text
        assert done(c, r.json()["id"])["result"] == "fork of fork"
        (new,) = scripted.requests_for(again)
        assert conversation(new)[-2:] == [("user", "Observation: 3 lines"), ("user", again)]
        assert len(scripted.requests_for(goal)) == asked + 1

        # What cannot be forked.
        def refused(task_id: str, status: int, **body: Any) -> dict[str, Any]:
            r = fork(c, task_id, **body)
            assert r.status_code == status, r.text
            return r.json()["error"]  # type: ignore[no-any-return]

        oid = original["id"]
        # Its last step is the final answer: it keeps at most steps 0..1.
        assert refused(oid, 400, checkpoint=3)["where"] == "checkpoint"
        # Schema errors name the field in the message, as for every route.
        assert refused(oid, 400, checkpoint=-1)["message"].startswith("checkpoint:")
        assert refused(oid, 400, checkpoint=0, tool_result="x")["where"] == "tool_result"
        assert refused(oid, 400, checkpoint=2, max_steps=2)["where"] == "max_steps"
        assert "colour" in refused(oid, 400, checkpoint=1, colour="red")["message"]
        refused("task_missing", 404, checkpoint=0)
        refused(oid, 400)  # no checkpoint


def test_fork_a_waiting_task_and_a_step_without_a_call(
    server: Server, scripted: ScriptedModel
) -> None:
    goal = scripted.script(
        "fork: waiting",
        tool("nonesuch"),
        tool("append", path="waiting.log", content="x\n"),
    )
    message = scripted.script("fork: do not write, answer", final("answered"))
    with server.client() as c:
        task = create(c, goal, ["append"], approvals={"effects": {"write": "ask"}})
        waiting = wait_for(c, f"{API}/tasks/{task['id']}", lambda t: t["status"] == "waiting")
        assert [s["action"] for s in waiting["steps"]] == ["nonesuch"]
        # Step 0 ran no call: its result cannot be replaced.
        r = fork(c, task["id"], checkpoint=1, tool_result="x")
        assert r.status_code == 400 and r.json()["error"]["where"] == "tool_result"
        # The call waiting at step 1 is not part of a fork at 1.
        r = fork(c, task["id"], checkpoint=1, message=message)
        assert r.status_code == 201, r.text
        forked = done(c, r.json()["id"])
        assert forked["status"] == "succeeded" and forked["result"] == "answered"
        assert [s["action"] for s in forked["steps"]] == ["nonesuch", "final"]
        assert len(scripted.requests_for(goal)) == 2
        assert not (server.settings.workspace_dir / "waiting.log").exists()
        still = c.get(f"{API}/tasks/{task['id']}").json()
        assert still["status"] == "waiting" and still["pending"] == waiting["pending"]
        assert c.post(f"{API}/tasks/{task['id']}/cancel").status_code == 200


def test_thread_continues_the_conversation(server: Server, scripted: ScriptedModel) -> None:
    first = scripted.script(
        "thread: list the file",
        {"delay": 1.0, "content": tool("append", path="thread.log", content="a\n")},
        final("one line"),
    )
    second = scripted.script("thread: and now?", final("still one line"))
    third = scripted.script("thread: thanks", final("you are welcome"))
    thread = "thread-sqlite"
    with server.client() as c:
        a = create(c, first, ["append"], thread_id=thread)
        assert a["thread_id"] == thread
        # One conversation at a time.
        r = c.post(f"{API}/tasks", json={"goal": second, "tools": [], "thread_id": thread})
        assert r.status_code == 409, r.text
        assert a["id"] in r.json()["error"]["message"]
        a = done(c, a["id"])
        assert a["status"] == "succeeded"
        b = done(c, create(c, second, [], thread_id=thread)["id"])
        assert b["status"] == "succeeded" and b["result"] == "still one line"
        c3 = done(c, create(c, third, [], thread_id=thread)["id"])

        # The next task starts from exactly the messages the last one held, its final answer
        # and its own goal.
        last_of_a = scripted.requests_for(first)[-1]
        (b_request,) = scripted.requests_for(second)
        assert conversation(b_request) == [
            *conversation(last_of_a),
            ("assistant", final("one line")),
            ("user", second),
        ]
        # Each task has its own system message (its agent's prompt, its own tools).
        assert "Tools:\n(none" in b_request["messages"][0]["content"]
        (c_request,) = scripted.requests_for(third)
        assert conversation(c_request) == [
            *conversation(b_request),
            ("assistant", final("still one line")),
            ("user", third),
        ]
        assert (server.settings.workspace_dir / "thread.log").read_text() == "a\n"

        listed = c.get(f"{API}/threads/{thread}")
        assert listed.status_code == 200
        body = listed.json()
        assert body["id"] == thread
        assert [t["id"] for t in body["tasks"]] == [a["id"], b["id"], c3["id"]]
        assert all(t["thread_id"] == thread for t in body["tasks"])
        assert c.get(f"{API}/threads/no-such-thread").status_code == 404

        # A fork starts a new thread (not one with tasks); the thread goes on from it.
        assert fork(c, a["id"], checkpoint=1, thread_id=thread).status_code == 409
        note = scripted.script("thread: fork note", final("forked"))
        r = fork(c, a["id"], checkpoint=1, message=note, thread_id="thread-branch")
        assert r.status_code == 201, r.text
        branched = done(c, r.json()["id"])
        assert branched["thread_id"] == "thread-branch"
        after = scripted.script("thread: after the fork", final("after"))
        done(c, create(c, after, [], thread_id="thread-branch")["id"])
        (request,) = scripted.requests_for(after)
        (fork_request,) = scripted.requests_for(note)
        assert conversation(request) == [
            *conversation(fork_request),
            ("assistant", final("forked")),
            ("user", after),
        ]
        branch = c.get(f"{API}/threads/thread-branch").json()
        assert len(branch["tasks"]) == 2 and branch["tasks"][0]["id"] == branched["id"]

    # The CLI.
    shown = conch("threads", "show", thread, "--url", server.url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [t["id"] for t in json.loads(shown.stdout)["tasks"]] == [a["id"], b["id"], c3["id"]]
    cli_note = scripted.script("thread: cli fork", final("cli fork"))
    made = conch(
        "tasks", "fork", a["id"], "--checkpoint", "1", "--message", cli_note,
        "--url", server.url, "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)
    assert record["forked_from"] == a["id"] and record["fork_checkpoint"] == 1
    bad = conch("tasks", "fork", a["id"], "--checkpoint", "9", "--url", server.url)
    assert bad.returncode == 1 and "400" in bad.stderr


def test_workflow_steps_in_a_thread(server: Server, scripted: ScriptedModel) -> None:
    ask = scripted.script("wf thread: ask", final("42"))
    check = scripted.script("wf thread: check", final("checked"))
    busy = scripted.script("wf thread: busy", {"delay": 2.0, "content": final("late")})
    steps = [
        {"id": "ask", "task": {"goal": ask, "tools": [], "thread_id": "wf-thread"}},
        {"id": "check", "depends_on": ["ask"],
         "task": {"goal": check, "tools": [], "thread_id": "wf-thread"}},
    ]  # fmt: skip
    with server.client() as c:
        wf = c.post(f"{API}/workflows", json={"steps": steps}).json()
        wf = wait_for(c, f"{API}/workflows/{wf['id']}", finished)
        assert wf["status"] == "succeeded", wf
        (request,) = scripted.requests_for(check)
        assert conversation(request) == [
            ("user", ask), ("assistant", final("42")), ("user", check),
        ]  # fmt: skip
        assert len(c.get(f"{API}/threads/wf-thread").json()["tasks"]) == 2
        # Parallel steps in one thread: the one that finds it busy fails with Conflict.
        pair = [
            {"id": f"p{i}", "task": {"goal": busy, "tools": [], "thread_id": "wf-busy"}}
            for i in range(2)
        ]
        wf = c.post(f"{API}/workflows", json={"steps": pair}).json()
        wf = wait_for(c, f"{API}/workflows/{wf['id']}", finished)
        kinds = sorted((s["error"] or {}).get("kind", "") for s in wf["steps"])
        assert kinds == ["", "Conflict"], wf


def test_openapi_documents_forks_and_threads(server: Server) -> None:
    with server.client() as c:
        doc = c.get("/api-docs/openapi.json").json()
    fork_op = doc["paths"][f"{API}/tasks/{{task_id}}/fork"]["post"]
    schema = fork_op["requestBody"]["content"]["application/json"]["schema"]
    assert {"checkpoint", "tool_result", "message", "max_steps", "thread_id"} <= set(
        schema["properties"]
    )
    assert schema["required"] == ["checkpoint"]
    assert f"{API}/threads/{{thread_id}}" in doc["paths"]
    record = doc["components"]["schemas"]["TaskRecord"]["properties"]
    assert {"thread_id", "forked_from", "fork_checkpoint"} <= set(record)
    create_schema = json.dumps(doc["paths"][f"{API}/tasks"]["post"])
    assert "thread_id" in create_schema


@pytest.mark.timeout(300)
def test_forks_and_threads_across_two_servers_on_postgres(
    tmp_path: Path, scripted: ScriptedModel
) -> None:
    with postgres_cluster(tmp_path) as url:
        env = {
            "database_url": url,
            "models_url": scripted.v1,
            "orchestration_lease_s": "3",
            "workers": "1",
            # the thread's calls write each server's shared workspace, as asserted
            "thread_sessions": "false",
        }
        a = start_process_server(tmp_path / "a", tmp_path / "a.log", **env)
        b = start_process_server(tmp_path / "b", tmp_path / "b.log", **env)
        try:
            with a.client() as ca, b.client() as cb:
                _across(ca, cb, scripted, tmp_path)
        finally:
            a.stop()
            b.stop()


def _across(ca: httpx.Client, cb: httpx.Client, scripted: ScriptedModel, tmp: Path) -> None:
    one = tool("append", path="pg.log", content="1\n")
    first = scripted.script(
        "pg thread: first", {"delay": 1.5, "content": one}, final("first done")
    )
    second = scripted.script("pg thread: second", final("second done"))
    thread = "pg-thread"

    # Two servers add to one empty thread at once: one wins, the other gets 409.
    answers: list[httpx.Response] = []

    def add(c: httpx.Client) -> None:
        answers.append(
            c.post(f"{API}/tasks", json={"goal": first, "tools": ["append"], "thread_id": thread})
        )

    racers = [threading.Thread(target=add, args=(c,)) for c in (ca, cb)]
    for r in racers:
        r.start()
    for r in racers:
        r.join()
    assert sorted(r.status_code for r in answers) == [201, 409], [r.text for r in answers]
    task_a = next(r.json() for r in answers if r.status_code == 201)
    task_a = done(ca, task_a["id"])
    assert task_a["status"] == "succeeded", task_a

    # The next task of the thread, on the other server, continues the conversation.
    made = cb.post(f"{API}/tasks", json={"goal": second, "tools": [], "thread_id": thread})
    assert made.status_code == 201, made.text
    task_b = done(cb, made.json()["id"])
    assert task_b["result"] == "second done"
    (b_request,) = scripted.requests_for(second)
    assert conversation(b_request) == [
        *conversation(scripted.requests_for(first)[-1]),
        ("assistant", final("first done")),
        ("user", second),
    ]
    for c in (ca, cb):
        listed = c.get(f"{API}/threads/{thread}").json()
        assert [t["id"] for t in listed["tasks"]] == [task_a["id"], task_b["id"]]

    # A fork on the other server of a task run by the first: nothing asked or run again.
    asked = len(scripted.requests_for(first))
    note = scripted.script("pg thread: fork note", final("forked on b"))
    r = cb.post(
        f"{API}/tasks/{task_a['id']}/fork",
        json={"checkpoint": 1, "tool_result": "edited", "message": note},
    )
    assert r.status_code == 201, r.text
    forked = done(ca, r.json()["id"])
    assert forked["status"] == "succeeded" and forked["result"] == "forked on b"
    assert forked["steps"][0]["observation"] == "edited"
    assert len(scripted.requests_for(first)) == asked
    (new,) = scripted.requests_for(note)
    assert conversation(new)[-2:] == [("user", "Observation: edited"), ("user", note)]
    appended = [
        (tmp / d / "workspace" / "pg.log").read_text()
        for d in ("a", "b")
        if (tmp / d / "workspace" / "pg.log").exists()
    ]
    assert appended == ["1\n"]
    assert ca.get(f"{API}/tasks/{task_a['id']}").json() == task_a


def test_fork_and_thread_task_resume_after_sigkill(tmp_path: Path, scripted: ScriptedModel) -> None:
    """A fork and a thread's task, their new model turn in flight, survive a SIGKILL: the
    restarted server resumes them from their own checkpoints and histories, and nothing kept
    from the original or the thread is asked or run again."""
    data, log = tmp_path / "data", tmp_path / "server.log"
    env = {"models_url": scripted.v1, "orchestration_lease_s": "3", "workers": "1",
           "thread_sessions": "false"}  # the thread's calls write the shared workspace
    goal = scripted.script_by_position(
        "restart fork: original", tool("append", path="r.log", content="1\n"), final("orig")
    )
    note = scripted.script_by_position(
        "restart fork: note",
        final("unused"),
        {"delay_first": 8, "content": tool("append", path="r.log", content="2\n")},
        final("fork done"),
    )
    later = scripted.script_by_position(
        "restart thread: later", {"delay_first": 8, "content": final("later done")}
    )
    first = start_process_server(data, log, **env)
    try:
        with first.client() as c:
            original = done(c, create(c, goal, ["append"], thread_id="restart-thread")["id"])
            assert original["status"] == "succeeded", original
            r = fork(c, original["id"], checkpoint=1, message=note)
            assert r.status_code == 201, r.text
            fork_id = r.json()["id"]
            later_id = create(c, later, [], thread_id="restart-thread")["id"]
            until_asked = wait_for(
                c, f"{API}/tasks/{fork_id}", lambda _t: len(scripted.requests_for(note)) == 1
            )
            assert until_asked["status"] == "running"
            wait_for(c, f"{API}/tasks/{later_id}", lambda _t: len(scripted.requests_for(later)) == 1)
        first.kill()
    finally:
        first.stop()
    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            forked = done(c, fork_id)
            resumed = done(c, later_id)
    finally:
        second.stop()
    assert forked["status"] == "succeeded" and forked["result"] == "fork done", forked
    assert [s["action"] for s in forked["steps"]] == ["append", "append", "final"]
    assert resumed["status"] == "succeeded" and resumed["result"] == "later done", resumed
    # The original's turns were asked once each; the fork's in-flight turn twice.
    assert len(scripted.requests_for(goal)) == 2
    assert len(scripted.requests_for(note)) == 3
    assert (data / "workspace" / "r.log").read_text() == "1\n2\n"
    # The thread's task asked again with the same history.
    one, two = scripted.requests_for(later)
    assert one["messages"] == two["messages"]
    assert conversation(two)[0] == ("user", goal)
