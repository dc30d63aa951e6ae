"""``conch sessions`` and ``conch files`` against a real agent server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testsupport.servers import SRC, Server, start_thread_server


def conch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "CONCH_CONFIG": "/nonexistent/conch.toml"}
    return subprocess.run(
        [sys.executable, "-m", "conch.cli.main", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_thread_server(tmp_path_factory.mktemp("cli-sessions"), workers=1,
                                  session_spares=1)
    yield running
    running.stop()


def test_sessions_and_files_cli(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        sid = c.post("/api/v1/sessions", json={}).json()["id"]
        c.post("/api/v1/execute", json={"command": "let total = 42", "session": sid})
    local = tmp_path / "data.csv"
    local.write_bytes(b"a,b\n1,2\n")

    put = conch("files", "put", sid, str(local), "in/data.csv", "--url", server.url, "--json")
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout)["name"] == "in/data.csv"
    listed = conch("files", "ls", sid, "in", "--url", server.url, "--json")
    assert [e["name"] for e in json.loads(listed.stdout)] == ["in/data.csv"]
    assert "data.csv" in conch("files", "ls", sid, "in", "--url", server.url).stdout
    got = conch("files", "get", sid, "in/data.csv", "copy.csv", "--url", server.url, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "copy.csv").read_bytes() == b"a,b\n1,2\n"
    out = conch("files", "get", sid, "in/data.csv", "-", "--url", server.url)
    assert out.stdout == "a,b\n1,2\n"
    missing = conch("files", "get", sid, "nothing.txt", "--url", server.url, cwd=tmp_path)
    assert missing.returncode == 1 and "404" in missing.stderr and "nothing.txt" in missing.stderr

    sessions = json.loads(conch("sessions", "list", "--url", server.url, "--json").stdout)
    assert sid in [s["id"] for s in sessions]
    shown = conch("sessions", "show", sid, "--url", server.url)
    assert shown.returncode == 0 and "total" in shown.stdout and "in" in shown.stdout
    detail = json.loads(conch("sessions", "show", sid, "--url", server.url, "--json").stdout)
    assert detail["bindings"] == [{"name": "total", "type": "Int"}]
    removed = conch("sessions", "rm", sid, "--url", server.url)
    assert removed.returncode == 0 and f"deleted {sid}" in removed.stdout
    gone = conch("sessions", "show", sid, "--url", server.url)
    assert gone.returncode == 1 and "404" in gone.stderr and "(session)" in gone.stderr
    unreachable = conch("sessions", "list", "--url", "http://127.0.0.1:9")
    assert unreachable.returncode == 2
