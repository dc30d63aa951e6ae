"""Fixtures: a scripted model server, and real agent servers (in a thread) pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testsupport.scripted_model import ScriptedModel
from testsupport.servers import Server, start_thread_server


@pytest.fixture(scope="session")
def scripted() -> Iterator[ScriptedModel]:
    model = ScriptedModel().start()
    yield model
    model.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedModel) -> Iterator[Server]:
    # thread_sessions off: these tests assert what a thread's calls leave in the shared
    # workspace (test_task_sessions.py has threads with sessions of their own).
    srv = start_thread_server(
        tmp_path_factory.mktemp("orch"), models_url=scripted.v1, wall_time_s=5.0,
        thread_sessions=False,
    )
    yield srv
    srv.stop()


@pytest.fixture()
def make_server(tmp_path: Path, scripted: ScriptedModel) -> Iterator[Any]:
    started: list[Server] = []

    def make(**overrides: Any) -> Server:
        overrides.setdefault("models_url", scripted.v1)
        srv = start_thread_server(tmp_path / f"data{len(started)}", **overrides)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
