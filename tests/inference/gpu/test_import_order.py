"""llama.cpp's libraries are in the process before numpy is imported, from every entry point
that can load a model (the CUDA build crashed loading a model otherwise: conch/inference/engines/llama/native.py).

Each case runs in a fresh interpreter with an import hook that, when numpy is first imported,
records whether libllama is already mapped (/proc/self/maps). It runs on the CPU build too:
the order is the same whichever backend the library has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")

SRC = Path(__file__).resolve().parents[3] / "src"

WATCH = """
import importlib.abc, json, sys
seen = {}
class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            with open("/proc/self/maps") as f:
                seen["numpy"] = any("libllama" in line for line in f)
        return None
sys.meta_path.insert(0, _Watch())
"""

REPORT = """
import numpy  # every case ends with numpy imported, so the hook always records
print("ORDER " + json.dumps({"llama_before_numpy": seen.get("numpy")}))
"""


def run_case(body: str, tmp_path: Path) -> bool:
    code = WATCH + textwrap.dedent(body) + REPORT
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               CONCH_DATA_DIR=str(tmp_path / "data"), CONCH_CONFIG=str(tmp_path / "none.toml"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ORDER "))
    return bool(json.loads(line[6:])["llama_before_numpy"])


CASES = {
    # `conch models serve`: the inference server's app
    "inference server": """
        from conch.config import load_settings
        from conch.web.inference.app import create_app
        create_app(load_settings())
    """,
    # the agent server's app first, then the inference server's (as `conch up` builds them)
    "both apps": """
        from conch.config import load_settings
        from conch.web.agent.app import create_app as agent
        from conch.web.inference.app import create_app as inference
        s = load_settings()
        agent(s)
        inference(s)
    """,
    # the real `conch models serve` and `conch up` commands; only uvicorn's serving loop is
    # skipped (the order is settled before it would start)
    "conch models serve": """
        import uvicorn
        uvicorn.run = lambda *a, **k: None
        from conch.cli.main import main
        try:
            main(["models", "serve", "--port", "0"])
        except SystemExit as exc:
            assert not exc.code, exc.code
    """,
    "conch up": """
        import uvicorn
        async def _no_serve(self, *a, **k):
            return None
        uvicorn.Server.serve = _no_serve
        from conch.cli.main import main
        try:
            main(["up", "--port", "0", "--models-port", "0"])
        except SystemExit as exc:
            assert not exc.code, exc.code
    """,
    # the engine and model manager, imported directly (benchmarks, tests, embedding users)
    "engine": """
        import conch.inference.serving.manager
    """,
}


@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_loads_before_numpy(case: str, tmp_path: Path) -> None:
    assert run_case(CASES[case], tmp_path), f"{case}: numpy was imported before libllama was loaded"


def test_the_check_sees_the_wrong_order(tmp_path: Path) -> None:
    """numpy first, then conch: the hook must report it (else the tests above prove nothing)."""
    assert not run_case("import numpy\nimport conch.inference.serving.manager\n", tmp_path)
