"""Agent tasks in sessions: the tasks of a thread share one session (its files carry over
the conversation and stay apart from every other thread's), a task may be given a session,
and a fork starts with a copy of its source's session (a stand-in model server scripts the
tool calls; real agent server, real workers)."""

from __future__ import annotations

from typing import Any

import httpx

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import finished, wait_for

API = "/api/v1/orchestration"


def _create(c: httpx.Client, goal: str, tools: list[str], **extra: Any) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json={"goal": goal, "tools": tools, **extra})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _done(c: httpx.Client, task_id: str) -> dict[str, Any]:
    record = wait_for(c, f"{API}/tasks/{task_id}", finished, 60)
    assert record["status"] == "succeeded", record
    return record


def _observations(task: dict[str, Any]) -> list[str]:
    return [str(s.get("observation")) for s in task["steps"] if s.get("action") != "final"]


def test_a_threads_tasks_share_a_session(make_server: Any, scripted: ScriptedModel) -> None:
    server = make_server(wall_time_s=5.0)
    write = scripted.script("session thread: note it",
                            tool("append", path="notes.txt", content="remember me\n"),
                            final("noted"))
    read = scripted.script("session thread: what did you note?",
                           tool("cat", path="notes.txt"), final("remember me"))
    other = scripted.script("session thread: another thread reads",
                            tool("cat", path="notes.txt"), final("nothing"))
    with server.client() as c:
        first = _done(c, _create(c, write, ["append"], thread_id="notes")["id"])
        second = _done(c, _create(c, read, ["cat"], thread_id="notes")["id"])
        assert first["session"] == second["session"] and first["session"].startswith("sess_")
        assert "remember me" in _observations(second)[0]
        # The file is the session's, not the server's shared workspace's.
        assert not (server.settings.workspace_dir / "notes.txt").exists()
        files = c.get(f"/api/v1/sessions/{first['session']}/files/notes.txt")
        assert files.text == "remember me\n"
        # Another thread has a session of its own, and sees none of it.
        elsewhere = _done(c, _create(c, other, ["cat"], thread_id="elsewhere")["id"])
        assert elsewhere["session"] != first["session"]
        assert "FileNotFoundError" in _observations(elsewhere)[0]
        # A task without a thread runs as it always did: no session, the shared workspace.
        plain = scripted.script("session thread: no thread", final("plain"))
        record = _done(c, _create(c, plain, [])["id"])
        assert "session" not in record


def test_a_task_given_a_session_and_a_fork_with_a_copy(make_server: Any,
                                                       scripted: ScriptedModel) -> None:
    server = make_server(wall_time_s=5.0)
    with server.client() as c:
        sid = c.post("/api/v1/sessions", json={}).json()["id"]
        c.put(f"/api/v1/sessions/{sid}/files/data.txt", content=b"uploaded\n")
        goal = scripted.script("given session: extend the data",
                               tool("append", path="data.txt", content="by the task\n"),
                               final("extended"))
        task = _done(c, _create(c, goal, ["append"], session=sid)["id"])
        assert task["session"] == sid
        assert c.get(f"/api/v1/sessions/{sid}/files/data.txt").text == "uploaded\nby the task\n"
        # The fork keeps step 0 (the append, not run again) and goes on in a copy.
        note = scripted.script("given session: fork and extend",
                               tool("append", path="data.txt", content="by the fork\n"),
                               final("forked"))
        r = c.post(f"{API}/tasks/{task['id']}/fork", json={"checkpoint": 1, "message": note})
        assert r.status_code == 201, r.text
        forked = _done(c, r.json()["id"])
        assert forked["session"] not in (None, sid)
        copy = c.get(f"/api/v1/sessions/{forked['session']}/files/data.txt").text
        assert copy == "uploaded\nby the task\nby the fork\n"
        # The source's session is as it was.
        assert c.get(f"/api/v1/sessions/{sid}/files/data.txt").text == "uploaded\nby the task\n"
        # A session that does not exist is refused, naming the field.
        r = c.post(f"{API}/tasks", json={"goal": "x", "tools": [],
                                         "session": "sess_000000000000000000000000"})
        assert r.status_code == 404 and r.json()["error"]["where"] == "session"
