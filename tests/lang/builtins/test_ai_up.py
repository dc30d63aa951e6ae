"""`conch up` wires models_url: a program on the agent server calls ai() and the inference
server started alongside answers it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.inference.providers.standins import free_port

pytestmark = pytest.mark.timeout(300)


def test_up_passes_models_url_to_the_agent_server(tmp_path: Path) -> None:
    port, models_port = free_port(), free_port()
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "PYTHONPATH": src, "CONCH_DATA_DIR": str(tmp_path / "data"),
           "CONCH_CONFIG": str(tmp_path / "none.toml"), "CONCH_WORKERS": "1", "CONCH_N_CTX": "1024"}
    env.pop("CONCH_MODELS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from conch.cli.main import main; sys.exit(main())",
         "up", "--port", str(port), "--models-port", str(models_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if (httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
                        and httpx.get(f"http://127.0.0.1:{models_port}/v1/health").status_code == 200):
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "conch up did not start"
            time.sleep(0.3)
        body = httpx.post(f"http://127.0.0.1:{port}/api/v1/eval", timeout=120,
                          json={"code": 'ai("Say hello.", max_tokens=5, temperature=0)'}).json()
        assert body["success"] is True and body["type"] == "String", body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
