"""A model that repeats a tool call that fails the same way (same tool, arguments and error)
is told so once, in the observation of its third such call, and a fourth ends the task as
``failed`` with ``StuckError`` instead of spending ``max_steps``: in both tool-call
protocols, against a real agent server and the scripted model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from testsupport.scripted_model import ScriptedModel, call, final, native, tool
from testsupport.servers import Server, finished, wait_for

pytestmark = pytest.mark.timeout(120)

API = "/api/v1/orchestration"
MODEL = "stuck-tools"  # native tool calls
NOTE = "has now failed 3 times in the same way"


def run(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json=body)
    assert r.status_code == 201, r.text
    return wait_for(c, f"{API}/tasks/{r.json()['id']}", finished, 60)


def observations(record: dict[str, Any]) -> list[str]:
    return [s["observation"] for s in record["steps"]]


def check_stuck(record: dict[str, Any], tool_name: str, args: dict[str, Any]) -> None:
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["kind"] == "StuckError", error
    assert error["count"] == 4
    assert error["call"] == {"tool": tool_name, "args": args}
    assert error["error"]["kind"] == "FileNotFoundError"
    assert tool_name in error["message"] and "4 times" in error["message"]
    assert error["error"]["message"] in error["message"]
    assert "Which model for agents" in error["hint"]
    # Four steps of the ten allowed; the note said once, at the third.
    assert len(record["steps"]) == 4
    notes = [NOTE in o for o in observations(record)]
    assert notes == [False, False, True, False]


@pytest.mark.parametrize("protocol", ["json", "native"])
def test_repeated_failing_call_ends_as_stuck(
    server: Server, scripted: ScriptedModel, protocol: str
) -> None:
    scripted.tool_models.add(MODEL)
    args = {"path": "workspace.json"}
    reply = tool("cat", **args) if protocol == "json" else native(call("cat", **args))
    goal = scripted.script(f"stuck ({protocol}): read a file that is not there", reply)
    body = {"goal": goal, "tools": ["cat", "ls"], "max_steps": 10}
    if protocol == "native":
        body["model"] = MODEL
    with server.client() as c:
        record = run(c, body)
    check_stuck(record, "cat", args)
    assert record["protocol"] == protocol
    # The model was told, in the conversation, before its fourth request.
    asked = scripted.requests_for(goal)
    assert len(asked) == 4
    assert NOTE in str(asked[3]["messages"][-1]["content"])
    assert not any(NOTE in str(m.get("content")) for m in asked[2]["messages"])


def test_note_heeded_goes_on(server: Server, scripted: ScriptedModel) -> None:
    bad = tool("cat", path="missing.txt")
    goal = scripted.script(
        "stuck: heeds the note", bad, bad, bad, tool("ls", path="."), final("no such file")
    )
    with server.client() as c:
        record = run(c, {"goal": goal, "tools": ["cat", "ls"], "max_steps": 10})
    assert record["status"] == "succeeded", record
    assert [NOTE in o for o in observations(record)[:4]] == [False, False, True, False]


def test_calls_that_fail_differently_are_not_stuck(server: Server, scripted: ScriptedModel) -> None:
    # Other arguments each time, or the same arguments with calls in between that fail
    # otherwise: no two alike reach four, and the step limit is what ends it.
    goal = scripted.script(
        "stuck: varied failures",
        tool("cat", path="a.txt"), tool("cat", path="b.txt"), tool("cat", path="a.txt"),
        tool("cat", path="c.txt"), tool("cat", path="a.txt"), tool("len", value=[1]),
        tool("cat", path="b.txt"),
    )  # fmt: skip
    with server.client() as c:
        record = run(c, {"goal": goal, "tools": ["cat", "len"], "max_steps": 7})
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "LimitError", record["error"]
    assert "max_steps" in record["error"]["hint"]
    assert len(record["steps"]) == 7
    assert [NOTE in o for o in observations(record)] == [False] * 4 + [True, False, False]


def test_a_fork_counts_its_kept_steps(server: Server, scripted: ScriptedModel) -> None:
    """Replaying a task (a fork, a resume) counts the replayed failures: the fork of a task
    after three failures stops at the next one, and its kept steps keep the note."""
    goal = scripted.script("stuck: forked", tool("cat", path="gone.txt"))
    with server.client() as c:
        original = run(c, {"goal": goal, "tools": ["cat"], "max_steps": 10})
        check_stuck(original, "cat", {"path": "gone.txt"})
        r = c.post(f"{API}/tasks/{original['id']}/fork", json={"checkpoint": 3})
        assert r.status_code == 201, r.text
        fork = wait_for(c, f"{API}/tasks/{r.json()['id']}", finished, 60)
    check_stuck(fork, "cat", {"path": "gone.txt"})
    assert observations(fork)[:3] == observations(original)[:3]
    assert len(scripted.requests_for(goal)) == 5  # four for the original, one for the fork
