"""``conch marketplace`` against a real server, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.web.agent_fixtures import AgentServer

SRC = str(Path(__file__).resolve().parents[2] / "src")


def conch(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "CONCH_CONFIG": str(tmp / "none.toml"),
        "CONCH_DATA_DIR": str(tmp / "data"),
    }
    return subprocess.run(
        [sys.executable, "-m", "conch.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_publish_search_install_uninstall(server: AgentServer, tmp_path: Path) -> None:
    manifest = tmp_path / "agent.toml"
    manifest.write_text(
        'name = "Todo Finder"\n'
        'version = "1.4.0"\n'
        'description = "Finds TODO comments in a source tree."\n'
        'system_prompt = "Call grep with pattern TODO and the directory. List path:line."\n'
        'tools = ["grep", "find"]\n'
        'model = "local:smollm2-135m-instruct"\n'
        'category = "code"\n'
        'tags = ["todo", "code"]\n'
    )
    url = ("--url", server.url)
    r = conch("marketplace", "publish", str(manifest), *url, "--json", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "todo-finder"
    r = conch("marketplace", "publish", str(manifest), *url, tmp=tmp_path)
    assert r.returncode == 1 and "409" in r.stderr and "immutable" in r.stderr

    r = conch("marketplace", "search", "todo", *url, "--json", tmp=tmp_path)
    assert json.loads(r.stdout)["results"][0]["name"] == "todo-finder"
    r = conch("marketplace", "search", "todo", *url, tmp=tmp_path)
    assert r.returncode == 0 and "todo-finder" in r.stdout

    r = conch("marketplace", "install", "todo-finder@^1", *url, tmp=tmp_path)
    assert r.returncode == 0 and "installed todo-finder@1.4.0" in r.stdout
    r = conch("marketplace", "list", *url, "--json", tmp=tmp_path)
    listed = {a["name"]: a for a in json.loads(r.stdout)}
    assert listed["todo-finder"]["installed_version"] == "1.4.0"
    r = conch("marketplace", "install", "todo-finder@^2", *url, tmp=tmp_path)
    assert r.returncode == 1 and "404" in r.stderr
    r = conch("marketplace", "uninstall", "todo-finder", *url, "--json", tmp=tmp_path)
    assert json.loads(r.stdout)["installed"] is False


def test_a_server_that_is_not_running_is_a_clear_error(tmp_path: Path) -> None:
    r = conch("marketplace", "list", "--url", "http://127.0.0.1:9", tmp=tmp_path)
    assert r.returncode == 2 and "cannot reach the agent server" in r.stderr
