"""``conch providers list|validate ID`` (``--json``) against the Ollama and Anthropic stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.inference.providers.standins import ANTHROPIC_KEY, closed_port_url


def conch(args: list[str], tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conch.toml").write_text(config)
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env.update(PYTHONPATH=src, CONCH_CONFIG=str(tmp_path / "conch.toml"), CONCH_DATA_DIR=str(tmp_path / "data"))
    return subprocess.run([sys.executable, "-c", "import sys; from conch.cli.main import main; sys.exit(main())",
                           "providers", *args], capture_output=True, text=True, timeout=120, env=env)


def test_list_and_validate(tmp_path: Path, ollama_standin: Any, anthropic_standin: Any) -> None:
    config = (f'ollama_url = "{ollama_standin.state.url}"\nanthropic_api_key = "{ANTHROPIC_KEY}"\n'
              f'[providers.anthropic]\nurl = "{anthropic_standin.state.url}"\n'
              f'[providers.down]\nurl = "{closed_port_url()}/v1"\n')
    done = conch(["list", "--json"], tmp_path, config)
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in json.loads(done.stdout)}
    assert rows["local"]["status"] == "available" and rows["ollama"]["status"] == "available"
    assert rows["anthropic"]["status"] == "available" and rows["openai"]["status"] == "unavailable"
    assert rows["down"]["status"] == "unavailable" and rows["down"]["url"].endswith("/v1")
    assert ANTHROPIC_KEY not in done.stdout

    done = conch(["validate", "ollama", "--json"], tmp_path, config)
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["valid"] is True and result["models_available"] == 4

    done = conch(["validate", "down"], tmp_path, config)
    assert done.returncode == 1 and "not valid" in done.stdout and "down" in done.stdout

    done = conch(["validate", "nope"], tmp_path, config)
    assert done.returncode == 2 and "Unknown provider 'nope'" in done.stderr

    done = conch(["list"], tmp_path, config)
    assert done.returncode == 0 and "ollama" in done.stdout
