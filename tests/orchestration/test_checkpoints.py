"""Checkpoints: a real ``conch serve`` process is killed with SIGKILL while agent tasks are
between two tool calls, right after a model turn (its tool call running), in the middle of a
call with an outside effect and waiting for an approval; restarted on the same database,
each task resumes from its checkpoint and nothing that completed runs again: the scripted
model's requests and the tools' side effects (lines appended to workspace files, requests
to an outside endpoint) are counted."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import finished, start_process_server, wait_for

API = "/api/v1/orchestration"
ASK_WRITE = {"effects": {"write": "ask"}}


def positions(scripted: ScriptedModel, goal: str) -> Counter[int]:
    """How many requests the model had at each conversation position (replies it held)."""
    return Counter(
        sum(1 for m in r["messages"] if m["role"] == "assistant")
        for r in scripted.requests_for(goal)
    )


def checkpoint(c: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    r = c.get(f"{API}/tasks/{task_id}/checkpoint")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def started(entries: list[dict[str, Any]], call: str) -> bool:
    return any(e["kind"] == "call" and e["data"]["call_id"] == call for e in entries)


def until(condition: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigkill_then_resume_from_checkpoints(tmp_path: Path, scripted: ScriptedModel) -> None:
    data = tmp_path / "data"
    log = tmp_path / "server.log"
    env = {
        "models_url": scripted.v1,
        "allow_network": "true",
        "network_allow": '["127.0.0.1"]',
        "orchestration_lease_s": "3",
        # Three calls hold a sandbox for seconds (an outside effect, two sleeps): with the
        # default two, the others' quick calls could wait for one past the moment of the kill.
        "workers": "4",
    }
    effect_url = scripted.url + "/effects/outside"
    # Between two tool calls: the model's second turn is in flight when the server dies.
    between = scripted.script_by_position(
        "checkpoints: between two calls",
        tool("append", path="between.log", content="1\n"),
        {"delay_first": 8, "content": tool("append", path="between.log", content="2\n")},
        final("between done"),
    )
    # Right after a model turn: its reply recorded, its (pure) tool call running.
    after_turn = scripted.script_by_position(
        "checkpoints: after a model turn",
        tool("append", path="after.log", content="1\n"),
        tool("sleep", ms=4000),
        final("after done"),
    )
    # A call with an outside effect (network) running: not run again without a person.
    outside = scripted.script_by_position(
        "checkpoints: outside effect",
        tool("http_post", url=effect_url + "?delay_ms=15000", body="x"),
        final("outside done"),
    )
    # Waiting for an approval across the restart.
    approval = scripted.script_by_position(
        "checkpoints: waiting",
        tool("append", path="approved.log", content="yes\n"),
        final("approved done"),
    )
    # Its checkpoint is spoiled while the server is down.
    spoiled = scripted.script_by_position(
        "checkpoints: spoiled", tool("sleep", ms=30000), final("never")
    )

    first = start_process_server(data, log, **env)
    try:
        with first.client() as c:

            def make(goal: str, tools: list[str], **extra: Any) -> str:
                r = c.post(f"{API}/tasks", json={"goal": goal, "tools": tools, **extra})
                assert r.status_code == 201, r.text
                return str(r.json()["id"])

            ids = {
                "between": make(between, ["append"]),
                "after": make(after_turn, ["append", "sleep"]),
                "outside": make(outside, ["http_post"]),
                "approval": make(approval, ["append"], approvals=ASK_WRITE),
                "spoiled": make(spoiled, ["sleep"]),
            }
            until(
                lambda: (
                    any(e["kind"] == "result" for e in checkpoint(c, ids["between"]))
                    and positions(scripted, between)[1] == 1
                )
            )
            until(lambda: started(checkpoint(c, ids["after"]), "call_1"))
            until(lambda: scripted.effects.get("outside") == 1)
            until(lambda: started(checkpoint(c, ids["outside"]), "call_0"))
            wait_for(c, f"{API}/tasks/{ids['approval']}", lambda t: t["status"] == "waiting")
            until(lambda: started(checkpoint(c, ids["spoiled"]), "call_0"))
            before = {k: c.get(f"{API}/tasks/{v}").json() for k, v in ids.items()}
        first.kill()
    finally:
        first.stop()

    assert before["between"]["status"] == "running" and len(before["between"]["steps"]) == 1
    assert before["after"]["status"] == "running" and len(before["after"]["steps"]) == 1
    with sqlite3.connect(data / "conch.db") as db:
        db.execute(
            "UPDATE orch_checkpoints SET data = 'not json{' WHERE task_id = ? AND kind = 'model'",
            (ids["spoiled"],),
        )

    second = start_process_server(data, log, **env)
    try:
        with second.client() as c:
            rec = {
                k: wait_for(c, f"{API}/tasks/{ids[k]}", finished, 60)
                for k in ("between", "after", "spoiled")
            }
            # The call with an outside effect was running: it waits for a person.
            out = wait_for(
                c, f"{API}/tasks/{ids['outside']}", lambda t: t["status"] == "waiting", 30
            )
            assert scripted.effects["outside"] == 1
            (pending,) = out["pending"]
            assert pending["call_id"] == "call_0" and pending["tool"] == "http_post"
            assert pending["effect"] == "network"
            assert pending["reason"].startswith("interrupted:")
            # A person runs it again, without the delay this time.
            r = c.post(
                f"{API}/tasks/{ids['outside']}/approve",
                json={"args": {"url": effect_url, "body": "x"}},
            )
            assert r.status_code == 200, r.text
            rec["outside"] = wait_for(c, f"{API}/tasks/{ids['outside']}", finished, 30)

            # Still waiting after the restart; approved on the new server.
            still = c.get(f"{API}/tasks/{ids['approval']}").json()
            assert still["status"] == "waiting"
            assert still["pending"] == before["approval"]["pending"]
            assert c.post(f"{API}/tasks/{ids['approval']}/approve").status_code == 200
            rec["approval"] = wait_for(c, f"{API}/tasks/{ids['approval']}", finished, 30)
            resumed = c.get(f"{API}/tasks/{ids['after']}/events").text
    finally:
        second.stop()

    ws = data / "workspace"
    # Between two calls: the first call ran once, the turn in flight was asked again.
    assert rec["between"]["status"] == "succeeded", rec["between"]
    assert (ws / "between.log").read_text() == "1\n2\n"
    assert positions(scripted, between) == Counter({0: 1, 1: 2, 2: 1})
    assert [s["action"] for s in rec["between"]["steps"]] == ["append", "append", "final"]

    # After a model turn: no turn asked twice; the pure call running was run again.
    assert rec["after"]["status"] == "succeeded", rec["after"]
    assert (ws / "after.log").read_text() == "1\n"
    assert positions(scripted, after_turn) == Counter({0: 1, 1: 1, 2: 1})
    assert [s["action"] for s in rec["after"]["steps"]] == ["append", "sleep", "final"]
    assert "event: resume" in resumed and '"reason":"recovered"' in resumed

    # The outside effect: once before the crash, once more by a person's decision.
    assert rec["outside"]["status"] == "succeeded", rec["outside"]
    assert scripted.effects["outside"] == 2
    assert positions(scripted, outside) == Counter({0: 1, 1: 1})
    assert rec["outside"]["steps"][0]["args"] == {"url": effect_url, "body": "x"}

    # Waiting across the restart.
    assert rec["approval"]["status"] == "succeeded", rec["approval"]
    assert (ws / "approved.log").read_text() == "yes\n"
    assert positions(scripted, approval) == Counter({0: 1, 1: 1})

    # An unreadable checkpoint: failed as interrupted, nothing asked again.
    assert rec["spoiled"]["status"] == "failed"
    assert rec["spoiled"]["error"]["reason"] == "interrupted"
    assert "cannot be resumed" in rec["spoiled"]["error"]["message"]
    assert positions(scripted, spoiled) == Counter({0: 1})
