"""A real agent server (uvicorn on a free loopback port, in a thread) for the agent tests.

Test modules take the fixtures with ``from tests.web.agent_fixtures import *``; they live
here rather than in ``conftest.py`` so that this folder's two servers keep separate files.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch.config import Settings
from conch.sandbox.pool import SandboxPool

__all__ = [
    "AgentServer",
    "agent_server",
    "agent_server_factory",
    "start_agent_server",
]


@dataclass
class AgentServer:
    url: str
    settings: Settings
    app: Any
    _server: Any
    _thread: threading.Thread

    @property
    def pool(self) -> SandboxPool:
        return self.app.state.pool  # type: ignore[no-any-return]

    @property
    def workspace(self) -> Path:
        return self.settings.workspace_dir

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("timeout", 60)
        return httpx.Client(base_url=self.url, **kw)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def start_agent_server(data_dir: Path, *, language_checks: bool = True,
                       **overrides: Any) -> AgentServer:
    """``language_checks=False``: workers without the language's own path, effect and
    network checks (the kernel layers' tests)."""
    import uvicorn

    from conch.web.agent.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    overrides.setdefault("workers", 2)
    settings = Settings(data_dir=data_dir, port=port, **overrides)
    pool = None if language_checks else SandboxPool(settings, language_checks=False)
    app = create_app(settings, pool)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )

    def serve() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=serve, daemon=True, name=f"agent-server-{port}")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the agent server did not start")
        time.sleep(0.02)
    return AgentServer(f"http://127.0.0.1:{port}", settings, app, server, thread)


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    running = start_agent_server(tmp_path_factory.mktemp("agent-data"), wall_time_s=3.0)
    yield running
    running.stop()


@pytest.fixture()
def agent_server_factory(tmp_path: Path) -> Iterator[Callable[..., AgentServer]]:
    started: list[AgentServer] = []

    def make(**overrides: Any) -> AgentServer:
        data = tmp_path / f"data{len(started)}"
        running = start_agent_server(data, **overrides)
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
