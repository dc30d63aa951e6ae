"""Bearer key, Host-header guard and bind policy of the agent server (SPEC §2.4)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch.config import Settings
from conch.web.agent.app import ConfigurationError, create_app
from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer

KEY = "s3cret-key-for-tests"

ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/api/v1/execute", {"command": "1"}),
    ("POST", "/api/v1/eval", {"code": "1"}),
    ("POST", "/api/v1/call/upper", {"args": ["a"]}),
    ("POST", "/api/v1/pipeline", {"input": [1], "steps": ["sum"]}),
    ("POST", "/api/v1/stream/execute", {"command": "1"}),
    ("POST", "/api/v1/stream/eval", {"code": "1"}),
    ("POST", "/api/v1/stream/pipeline", {"input": [1], "steps": ["sum"]}),
    ("GET", "/api/v1/builtins", None),
    ("GET", "/api/v1/builtins/map", None),
    ("GET", "/api/v1/types", None),
    ("GET", "/api/v1/schema", None),
    ("GET", "/api/v1/schema/openapi", None),
    ("GET", "/metrics", None),
    ("GET", "/api-docs/openapi.json", None),
]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.web.agent_fixtures import start_agent_server

    server = start_agent_server(tmp_path_factory.mktemp("keyed"), api_key=KEY)
    yield server
    server.stop()


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_every_route_needs_the_key(
    keyed_server: AgentServer, method: str, path: str, body: dict[str, Any] | None
) -> None:
    with keyed_server.client() as c:
        missing = c.request(method, path, json=body)
        wrong = c.request(method, path, json=body, headers={"Authorization": "Bearer nope"})
        basic = c.request(method, path, json=body, headers={"Authorization": f"Basic {KEY}"})
        good = c.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
    for r in (missing, wrong, basic):
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["success"] is False
    assert good.status_code == 200


def test_health_needs_no_key(keyed_server: AgentServer) -> None:
    with keyed_server.client() as c:
        assert c.get("/health").status_code == 200


def test_foreign_host_header_refused_on_loopback(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        for host in (
            "evil.example",
            "attacker.test:3000",
            "192.168.1.10",
            "localhost.evil.example",
        ):
            r = c.get("/api/v1/builtins", headers={"Host": host})
            assert r.status_code == 403, host
            r = c.post("/api/v1/execute", json={"command": "1"}, headers={"Host": host})
            assert r.status_code == 403
        for host in ("localhost", "localhost:3000", "127.0.0.1", "127.0.0.1:9", "[::1]:3000"):
            assert c.get("/health", headers={"Host": host}).status_code == 200, host


def test_non_loopback_bind_needs_a_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        create_app(Settings(data_dir=tmp_path, host="0.0.0.0"))
    create_app(Settings(data_dir=tmp_path, host="0.0.0.0", api_key=KEY))  # allowed with a key


def test_serve_command_refuses_non_loopback_without_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env["CONCH_DATA_DIR"] = str(tmp_path)
    env["CONCH_CONFIG"] = str(tmp_path / "none.toml")
    code = "import typer; from conch.cli.serve import serve; typer.run(serve)"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "API key" in proc.stderr


def test_non_loopback_bind_has_no_host_guard_but_needs_key(
    agent_server_factory: Callable[..., AgentServer],
) -> None:
    # Bound to all interfaces (tests reach it over loopback): a key is the guard.
    server = agent_server_factory(host="0.0.0.0", api_key=KEY)
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/api/v1/types", headers={"Host": "conch.example"})
        assert r.status_code == 401
        r = c.get(
            "/api/v1/types", headers={"Host": "conch.example", "Authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 200
