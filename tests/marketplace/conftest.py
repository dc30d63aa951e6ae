"""Real agent servers on loopback for the marketplace tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from tests.web.agent_fixtures import AgentServer, start_agent_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    running = start_agent_server(tmp_path_factory.mktemp("market"), workers=1, wall_time_s=5.0)
    yield running
    running.stop()
    db.dispose_all()


@pytest.fixture()
def fresh_server(tmp_path: Path) -> Iterator[Callable[..., AgentServer]]:
    started: list[AgentServer] = []

    def make(**overrides: Any) -> AgentServer:
        overrides.setdefault("workers", 1)
        running = start_agent_server(tmp_path / f"data{len(started)}", **overrides)
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()


@pytest.fixture()
def client(server: AgentServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def agent(name: str, **fields: Any) -> dict[str, Any]:
    """A valid publish body."""
    body: dict[str, Any] = {
        "name": name,
        "description": f"{name} does useful things",
        "system_prompt": "You are helpful. Use the tools.",
        "tools": ["cat", "grep"],
        "model": "local:smollm2-135m-instruct",
    }
    body.update(fields)
    return body
