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
