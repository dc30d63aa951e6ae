"""The language tests run with a data directory and configuration of their own: the ``ai`` and
``embed`` examples run models in-process (as the shell does), which reads the settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _own_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from conch.config import get_settings

    root = tmp_path_factory.mktemp("conch-lang")
    patch = pytest.MonkeyPatch()
    patch.setenv("CONCH_DATA_DIR", str(root / "data"))
    patch.setenv("CONCH_CONFIG", str(root / "conch.toml"))  # absent: defaults only
    patch.delenv("CONCH_MODELS_URL", raising=False)
    get_settings.cache_clear()
    yield
    patch.undo()
    get_settings.cache_clear()
