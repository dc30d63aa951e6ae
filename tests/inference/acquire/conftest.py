from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.models.acquire import Acquirer
from conch.inference.models.store import ModelStore


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CONCH_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    s = Settings(data_dir=tmp_path / "data")
    s.ensure_dirs()
    return s


@pytest.fixture
def store(settings: Settings) -> ModelStore:
    return ModelStore(settings)


@pytest.fixture
def acquirer(settings: Settings, store: ModelStore) -> Acquirer:
    return Acquirer(settings, store)
