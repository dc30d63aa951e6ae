"""The ollama source against a loopback server speaking the registry's OCI protocol."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conch.inference.models.sources import FetchRequest, NotFound, VerificationFailed, fetch
from conch.inference.models.sources.ollama import parse_name
from tests.inference.sources.servers import OllamaRegistry

TEMPLATE = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>{{ end }}"


def _req(registry: str, name: str, revision: str | None = None) -> FetchRequest:
    return FetchRequest(model_id="m", source="ollama", name=name, registry=registry, revision=revision)


def test_pull_model_layer_and_template(small_gguf: bytes, tmp_path: Path) -> None:
    reg = OllamaRegistry()
    reg.add_model("library/tiny", "latest", small_gguf, TEMPLATE)
    with reg.run() as url:
        result = fetch(_req(url, "tiny"), tmp_path, None)
    assert result.format == "gguf"
    assert (tmp_path / result.path).read_bytes() == small_gguf
    assert result.sha256 == hashlib.sha256(small_gguf).hexdigest()
    assert (tmp_path / "template").read_text() == TEMPLATE
    assert "params.json" in result.files
    assert result.revision is not None and result.revision.startswith("latest@sha256:")


def test_tag_from_name_or_revision(small_gguf: bytes, tmp_path: Path) -> None:
    reg = OllamaRegistry()
    reg.add_model("someone/tiny", "q8", small_gguf)
    with reg.run() as url:
        a = fetch(_req(url, "someone/tiny:q8"), tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path, None)
        (tmp_path / "b").mkdir()
        b = fetch(_req(url, "someone/tiny", revision="q8"), tmp_path / "b", None)
    assert a.sha256 == b.sha256 == hashlib.sha256(small_gguf).hexdigest()
    assert parse_name("llama3.2:1b", None) == ("library/llama3.2", "1b")
    assert parse_name("llama3.2", None) == ("library/llama3.2", "latest")


def test_digest_mismatch_is_rejected(small_gguf: bytes, tmp_path: Path) -> None:
    reg = OllamaRegistry()
    reg.add_model("library/tiny", "latest", small_gguf)
    reg.tamper.add("sha256:" + hashlib.sha256(small_gguf).hexdigest())
    with reg.run() as url, pytest.raises(VerificationFailed):
        fetch(_req(url, "tiny"), tmp_path, None)
    assert not any(p.suffix == ".gguf" for p in tmp_path.iterdir())


def test_unknown_model(tmp_path: Path) -> None:
    reg = OllamaRegistry()
    with reg.run() as url, pytest.raises(NotFound):
        fetch(_req(url, "nothing"), tmp_path, None)
