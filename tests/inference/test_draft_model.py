"""A draft model per model (``draft_model`` in ``[model_overrides.ID]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import conch.inference.engines.llama.engine as le
from conch.config import Settings
from conch.inference.engines.base import EngineError
from conch.inference.offload import runtime_options


def test_draft_model_is_read_from_the_model_overrides(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, model_overrides={"big": {"draft_model": "small"}})
    assert runtime_options(settings, "big", gpu_backend=False).draft_model == "small"
    assert runtime_options(settings, "other", gpu_backend=False).draft_model is None


def test_a_draft_model_is_not_silently_ignored(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, model_overrides={"big": {"draft_model": "small"}})
    engine = le.LlamaEngine("big", "/nonexistent.gguf", runtime=runtime_options(settings, "big", gpu_backend=False))
    with pytest.raises(EngineError, match="draft_model"):
        engine.load()
    assert not engine.loaded
