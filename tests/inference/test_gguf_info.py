"""GGUF metadata of the real bundled SmolLM2 file."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.inference.models.files import sha256_file
from conch.inference.models.gguf_info import read_gguf_info


def test_reads_smollm2_metadata(smollm2_path: Path) -> None:
    info = read_gguf_info(smollm2_path)
    assert info.architecture == "llama"
    assert info.context_length == 8192
    assert info.quantization == "Q4_1"
    assert info.embedding_length == 576
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template
    assert info.capabilities == ["chat", "embeddings"]
    assert info.size_bytes == smollm2_path.stat().st_size


def test_rejects_non_gguf(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_info(f)


def test_sha256(tmp_path: Path) -> None:
    f = tmp_path / "a"
    f.write_bytes(b"abc")
    assert sha256_file(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
