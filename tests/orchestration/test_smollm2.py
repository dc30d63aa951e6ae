"""The whole loop with the real bundled SmolLM2, through a real conch inference server: the
agent server reaches it only over its OpenAI-compatible API, with decoding constrained by
the action schema (a llama.cpp grammar)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conch import db
from conch.orchestration.protocols import action_schema
from tests.web.conftest import start_server
from testsupport.servers import Server, finished, start_thread_server, wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def inference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    running, server, thread = start_server(
        tmp_path_factory.mktemp("models"), n_parallel=1, n_ctx=2048
    )
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def test_smollm2_task_with_ls_and_len(tmp_path: Path, inference: Any) -> None:
    srv: Server = start_thread_server(tmp_path / "data", models_url=inference.v1)
    (srv.settings.workspace_dir).mkdir(parents=True, exist_ok=True)
    for name in ("a.txt", "b.txt", "c.txt"):
        (srv.settings.workspace_dir / name).write_text("hello\n")
    try:
        with srv.client(timeout=300) as c:
            r = c.post(
                "/api/v1/orchestration/tasks",
                json={
                    "goal": "How many files are in the directory '.'? Use ls, then len.",
                    "tools": ["ls", "len"],
                    "max_steps": 3,
                },
            )
            assert r.status_code == 201, r.text
            task = wait_for(c, f"/api/v1/orchestration/tasks/{r.json()['id']}", finished, 540)
    finally:
        srv.stop()
    assert task["status"] in ("succeeded", "failed"), task
    if task["status"] == "failed":
        assert task["error"]["kind"] == "LimitError", task["error"]
    assert 1 <= len(task["steps"]) <= 3
    schema = action_schema(["ls", "len"])
    for step in task["steps"]:
        action = (
            {"final": step["args"]["final"]}
            if step["action"] == "final"
            else {"tool": step["action"], "args": step["args"]}
        )
        jsonschema.validate(action, schema)
    assert task["usage"].get("completion_tokens", 0) > 0


def test_smollm2_readme_example_watched_live(tmp_path: Path, inference: Any) -> None:
    """The README's example task on the bundled model, watched with ``?deltas=true``: each
    model turn after the subscriber joined streams, and what streamed is the action the step
    records. The 135M model is too small for tool use: it repeats one failing call, is told
    so, and is stopped (``StuckError``) well before ``max_steps`` (docs/orchestration.md,
    "Which model for agents"); any other end is allowed, but not a silent one."""
    from conch.orchestration.protocols import parse_action
    from tests.orchestration.test_live_deltas import Reader, live

    srv: Server = start_thread_server(tmp_path / "data", models_url=inference.v1)
    srv.settings.workspace_dir.mkdir(parents=True, exist_ok=True)
    for name in ("notes.txt", "data.csv", "report.md"):
        (srv.settings.workspace_dir / name).write_text("x\n")
    api = "/api/v1/orchestration/tasks"
    try:
        with srv.client(timeout=300) as c:
            r = c.post(api, json={
                "goal": "How many files are in the workspace?", "tools": ["ls", "len"],
                "max_steps": 6, "approvals": {"tools": {"ls": "ask"}},
            })  # fmt: skip
            assert r.status_code == 201, r.text
            task_id = r.json()["id"]
            # Its first turn is not watched; once it waits (or ends), watch the rest.
            first = wait_for(c, f"{api}/{task_id}", lambda t: t["status"] != "running"
                             and t["status"] != "pending", 540)  # fmt: skip
            reader = Reader(srv, f"{api}/{task_id}/events?deltas=true")
            record = first
            while not finished(record):
                if record["status"] == "waiting":
                    assert c.post(f"{api}/{task_id}/approve").status_code == 200
                record = wait_for(c, f"{api}/{task_id}", lambda t: t["status"] != "running", 540)
            events = reader.join(60)
    finally:
        srv.stop()
    assert record["status"] in ("succeeded", "failed"), record
    if record["status"] == "failed":
        assert record["error"]["kind"] in ("StuckError", "LimitError"), record["error"]
        assert "Which model for agents" in record["error"]["hint"]
    if record["error"] and record["error"]["kind"] == "StuckError":
        assert len(record["steps"]) == 4 and record["error"]["count"] == 4
        assert "has now failed 3 times" in record["steps"][2]["observation"]
    watched = [s for s in record["steps"] if live(events, "model_start", s["index"])]
    assert watched, "no model turn was watched"
    for step in watched:
        start = live(events, "model_start", step["index"])[0]
        assert start["streamed"] is True
        deltas = live(events, "delta", step["index"])
        text = "".join(d["text"] for d in deltas if d["type"] == "text")
        if step["action"] == "final":
            assert parse_action(text) == {"final": step["args"]["final"]}
        else:
            assert parse_action(text) == {"tool": step["action"], "args": step["args"]}
        end = live(events, "model_end", step["index"])[-1]
        assert end["tokens"] == len(deltas) > 0
        assert end["usage"]["completion_tokens"] > 0
        assert end["usage"] == step["usage"]
