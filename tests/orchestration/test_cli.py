"""``conch tasks`` and ``conch workflows`` against a real agent server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testsupport.scripted_model import ScriptedModel, final
from testsupport.servers import SRC, Server, finished, wait_for


def conch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "CONCH_CONFIG": "/nonexistent/conch.toml"}
    return subprocess.run(
        [sys.executable, "-m", "conch.cli.main", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


def test_workflows_and_tasks_cli(server: Server, scripted: ScriptedModel, tmp_path: Path) -> None:
    definition = tmp_path / "wf.toml"
    definition.write_text(
        'name = "cli"\n[inputs]\nn = 5\n\n'
        '[[steps]]\nid = "total"\nrun = "range(0, inputs.n) | sum"\n\n'
        '[[steps]]\nid = "double"\ndepends_on = ["total"]\nrun = "steps.total.result * 2"\n'
    )
    run = conch("workflows", "run", str(definition), "--url", server.url, "--json")
    assert run.returncode == 0, run.stderr
    wf = json.loads(run.stdout)
    assert wf["status"] == "succeeded" and wf["steps"][1]["result"] == 20

    listed = json.loads(conch("workflows", "list", "--url", server.url, "--json").stdout)
    assert any(w["id"] == wf["id"] for w in listed)
    shown = conch("workflows", "show", wf["id"], "--url", server.url)
    assert shown.returncode == 0 and "double" in shown.stdout
    again = conch("workflows", "cancel", wf["id"], "--url", server.url)
    assert again.returncode == 1 and "409" in again.stderr

    goal = scripted.script("cli task", {"delay": 30, "content": final("late")})
    with server.client() as c:
        task = c.post(
            "/api/v1/orchestration/tasks", json={"goal": goal, "tools": [], "max_steps": 2}
        ).json()
    tasks = json.loads(conch("tasks", "list", "--url", server.url, "--json").stdout)
    assert any(t["id"] == task["id"] for t in tasks)
    cancelled = conch("tasks", "cancel", task["id"], "--url", server.url, "--json")
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["status"] == "cancelled"
    with server.client() as c:
        wait_for(c, f"/api/v1/orchestration/tasks/{task['id']}", finished)
    shown_task = conch("tasks", "show", task["id"], "--url", server.url)
    assert shown_task.returncode == 0 and "cancelled" in shown_task.stdout
    missing = conch("tasks", "show", "task_missing", "--url", server.url)
    assert missing.returncode == 1 and "404" in missing.stderr


def test_tasks_create_cli_protocol(server: Server, scripted: ScriptedModel) -> None:
    # The scripted default model lists no tools, so `auto` would pick JSON actions: a task the
    # CLI forced to `native` shows that --protocol reached the server.
    forced = scripted.script("cli create: native", "done natively")
    made = conch("tasks", "create", forced, "--protocol", "native", "--max-steps", "2",
                 "--url", server.url, "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    task = json.loads(made.stdout)
    assert task["protocol"] == "native" and task["status"] == "succeeded"
    assert task["result"] == "done natively" and task["goal"] == forced

    # Without --protocol nothing is sent: the server decides (auto), JSON actions here.
    plain = scripted.script("cli create: auto", final("done with json"))
    made = conch("tasks", "create", plain, "--tool", "ls", "--url", server.url, "--json")
    assert made.returncode == 0, made.stderr
    task = json.loads(made.stdout)
    assert task["protocol"] == "json" and task["result"] == "done with json"
    assert task["tools"] == ["ls"]
    asked = [r for r in scripted.requests if any(m.get("content") == plain for m in r["messages"])]
    assert asked and all("tools" not in r for r in asked)  # JSON actions: no API tools

    # An unknown protocol is refused by the CLI before anything is created.
    before = len(json.loads(conch("tasks", "list", "--url", server.url, "--json").stdout))
    bad = conch("tasks", "create", "x", "--protocol", "xml", "--url", server.url)
    assert bad.returncode == 2 and "--protocol" in bad.stderr
    assert len(json.loads(conch("tasks", "list", "--url", server.url, "--json").stdout)) == before
