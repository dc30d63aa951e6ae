"""What the CLI tests share: the ``conch`` script of this environment and an environment
that runs it on a data directory of the test's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The process environment for ``conch``: none of the caller's CONCH_ settings, a data
    directory of the test's own, and no config file."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    clean["CONCH_DATA_DIR"] = str(tmp_path / "data")
    clean["CONCH_CONFIG"] = str(tmp_path / "absent.toml")
    return clean
