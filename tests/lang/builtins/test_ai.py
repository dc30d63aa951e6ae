"""ai / embed: through the agent server (sandbox workers reach models via models_url, never
load them) and in the shell (``conch -c``, the local model in-process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inference.providers.servers import conch_inference_server

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def models_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with conch_inference_server(tmp_path_factory.mktemp("models"), n_ctx=1024, n_parallel=2) as (url, _app):
        yield url


def test_ai_through_the_agent_server(models_url: str, tmp_path: Path) -> None:
    from tests.web.agent_fixtures import start_agent_server

    server = start_agent_server(tmp_path / "agent", workers=1, models_url=models_url)
    try:
        with server.client() as c:
            body = c.post("/api/v1/eval", json={"code": 'ai("Say hello.", max_tokens=6, temperature=0)'}).json()
            assert body["success"] is True, body
            assert body["type"] == "String" and body["value"]
            schema = '{type: "object", properties: {n: {type: "integer"}}, required: ["n"]}'
            body = c.post("/api/v1/eval", json={
                "code": f'ai("Pick a number.", schema={schema}, max_tokens=20, temperature=0)'}).json()
            assert body["success"] is True and isinstance(body["value"]["n"], int), body
            body = c.post("/api/v1/eval", json={"code": 'ai("x", model="no-such-model")'}).json()
            assert body["success"] is False and body["error"]["kind"] == "ValueError"
            assert "no-such-model" in body["error"]["message"]
        # The worker never loaded a model: the inference server served it.
        pids = server.pool.worker_pids()
        assert pids
        for pid in pids:
            assert "libllama" not in Path(f"/proc/{pid}/maps").read_text()
    finally:
        server.stop()


def test_model_effect_off_when_disallowed(models_url: str, tmp_path: Path) -> None:
    from tests.web.agent_fixtures import start_agent_server

    server = start_agent_server(tmp_path / "agent", workers=1, models_url=models_url, allow_model=False)
    try:
        with server.client() as c:
            body = c.post("/api/v1/eval", json={"code": 'ai("hi")'}).json()
        assert body["success"] is False and body["error"]["kind"] == "PermissionError"
    finally:
        server.stop()


def test_inference_server_down_is_a_clear_error(tmp_path: Path) -> None:
    from tests.inference.providers.standins import closed_port_url
    from tests.web.agent_fixtures import start_agent_server

    server = start_agent_server(tmp_path / "agent", workers=1, models_url=closed_port_url() + "/v1")
    try:
        with server.client() as c:
            body = c.post("/api/v1/eval", json={"code": 'embed("hi")'}).json()
        assert body["error"]["kind"] == "ProviderError" and "cannot reach the inference server" in body["error"]["message"]
    finally:
        server.stop()


def _conch(code: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[3] / "src")
    return subprocess.run(
        [sys.executable, "-c", "import sys; from conch.cli.main import main; sys.exit(main())", "-c", code],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": src, "CONCH_DATA_DIR": str(data_dir),
             "CONCH_CONFIG": str(data_dir / "none.toml"), **env},
    )


def test_ai_in_the_shell_runs_the_local_model_in_process(tmp_path: Path) -> None:
    done = _conch('ai("Say hello.", max_tokens=6, temperature=0) | type_of', tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "String"
    done = _conch('ai("A colour?", schema={type: "object", properties: {c: {type: "string"}}, '
                  'required: ["c"]}, max_tokens=24, temperature=0) | keys', tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["c"]


def test_shell_uses_models_url_when_set(models_url: str, tmp_path: Path) -> None:
    done = _conch('ai("Say hello.", max_tokens=4, temperature=0) | type_of', tmp_path, CONCH_MODELS_URL=models_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "String"
