"""Installed agents are orchestration agents: they run tasks (a scripted OpenAI-chat model on
loopback answers deterministically), block uninstall while running, and are MCP tools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp import Client

from tests.web.agent_fixtures import AgentServer, start_agent_server
from testsupport.scripted_model import ScriptedModel, final, tool


@pytest.fixture(scope="module")
def orch_server(
    tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedModel
) -> Iterator[AgentServer]:
    running = start_agent_server(
        tmp_path_factory.mktemp("agents"), workers=1, wall_time_s=5.0, models_url=scripted.v1
    )
    yield running
    running.stop()


def agents(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in c.get("/api/v1/orchestration/agents").json()}


def test_install_registers_and_uninstall_removes_the_agent(orch_server: AgentServer) -> None:
    with orch_server.client() as c:
        assert "csv-analyst" not in agents(c)
        r = c.post("/api/v1/marketplace/install", json={"name": "csv-analyst"})
        assert r.status_code == 200
        a = agents(c)["csv-analyst"]
        assert a["capabilities"] == ["cat", "from_csv", "describe", "sum", "avg", "min", "max"]
        assert a["model"] == "local:smollm2-135m-instruct"
        assert (
            c.post("/api/v1/marketplace/uninstall", json={"name": "csv-analyst"}).status_code == 200
        )
        assert "csv-analyst" not in agents(c)


def test_default_is_a_reserved_name(orch_server: AgentServer) -> None:
    with orch_server.client() as c:
        r = c.post(
            "/api/v1/marketplace/publish",
            json={
                "name": "Default",
                "description": "d",
                "system_prompt": "p",
                "tools": [],
                "model": "local:m",
            },
        )
        assert r.status_code == 400 and r.json()["error"]["field"] == "name"


def test_uninstall_while_a_task_runs_is_a_conflict(
    orch_server: AgentServer, scripted: ScriptedModel
) -> None:
    goal = scripted.script("slow log check", {"delay": 2.0, "content": final("all quiet")})
    with orch_server.client() as c:
        assert (
            c.post("/api/v1/marketplace/install", json={"name": "log-analyst"}).status_code == 200
        )
        task = c.post(
            "/api/v1/orchestration/tasks",
            json={"goal": goal, "agent": "log-analyst", "max_steps": 3},
        ).json()
        r = c.post("/api/v1/marketplace/uninstall", json={"name": "log-analyst"})
        assert r.status_code == 409 and r.json()["error"]["kind"] == "ConflictError"
        assert "log-analyst" in agents(c)
        deadline = time.monotonic() + 30
        while True:
            status = c.get(f"/api/v1/orchestration/tasks/{task['id']}").json()["status"]
            if status not in ("pending", "running") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == "succeeded"
        assert (
            c.post("/api/v1/marketplace/uninstall", json={"name": "log-analyst"}).status_code == 200
        )


def test_an_installed_agent_is_an_mcp_tool_that_runs_a_task(
    orch_server: AgentServer, scripted: ScriptedModel
) -> None:
    (orch_server.workspace / "notes.txt").write_text("Ship on Friday.\nTests are green.\n")
    goal = scripted.script(
        "Summarise notes.txt",
        tool("cat", path="notes.txt"),
        final("Two points: ship on Friday; tests are green."),
    )
    with orch_server.client() as c:
        assert (
            c.post("/api/v1/marketplace/install", json={"name": "file-summariser"}).status_code
            == 200
        )

    async def go() -> tuple[list[str], Any, Any]:
        async with Client(orch_server.url + "/mcp") as client:
            names = [t.name for t in (await client.list_tools()).tools]
            ok = await client.call_tool("agent-file-summariser", {"goal": goal, "max_steps": 4})
            bad = await client.call_tool("agent-file-summariser", {"goal": ""})
            return names, ok, bad

    names, ok, bad = asyncio.run(go())
    assert "agent-file-summariser" in names
    assert ok.is_error is False
    assert ok.content[0].text == "Two points: ship on Friday; tests are green."
    # the model really saw the file through the agent's tool
    second = scripted.requests_for(goal)[1]
    assert any("Ship on Friday." in str(m.get("content")) for m in second["messages"])
    assert bad.is_error is True and bad.content[0].text.startswith("TypeError: ")
