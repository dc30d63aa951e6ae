"""Peers that cannot share conch's environment (they pin versions of conch's own
dependencies) get a virtualenv each in ``.bench-cache``, made on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CACHE = Path(__file__).resolve().parent.parent / ".bench-cache"


def peer_venv(name: str, requirements: list[str], probe: str) -> Path:
    """The ``bin`` folder of the virtualenv ``.bench-cache/<name>`` with ``requirements``
    installed (``probe`` is a module that imports once they are); ``RuntimeError`` saying why
    when it cannot be made."""
    venv = CACHE / name
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import {probe}"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return venv / "bin"
    CACHE.mkdir(exist_ok=True)
    for command in (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", *requirements],
    ):
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command[-3:])} failed: {proc.stderr.strip()[-300:]}")
    return venv / "bin"
