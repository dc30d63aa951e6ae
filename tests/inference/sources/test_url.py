"""The url source against a plain loopback HTTP server: resume with Range, sha256 checks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from conch.inference.models.sources import (
    BadRequest,
    FetchRequest,
    NotFound,
    SourceUnreachable,
    VerificationFailed,
    fetch,
)
from tests.inference.sources.servers import FileServer

# A hang (a stuck socket or thread) fails the test instead of stalling the suite.
pytestmark = pytest.mark.timeout(300)

DATA = os.urandom(3 * 1024 * 1024 + 17)
SHA = hashlib.sha256(DATA).hexdigest()


def _req(url: str, tmp_path: Path, **kw: object) -> FetchRequest:
    return FetchRequest(model_id="m", source="url", url=url, resume_dir=tmp_path / "resume", **kw)  # type: ignore[arg-type]


def test_download_with_sha256(small_gguf: bytes, tmp_path: Path) -> None:
    server = FileServer({"models/tiny.gguf": small_gguf})
    staging = tmp_path / "stage"
    staging.mkdir()
    events: list[dict[str, object]] = []
    with server.run() as base:
        result = fetch(_req(f"{base}/models/tiny.gguf", tmp_path,
                            sha256=hashlib.sha256(small_gguf).hexdigest()), staging, events.append)
    assert result.files == ["tiny.gguf"] and result.format == "gguf"
    assert (staging / "tiny.gguf").read_bytes() == small_gguf
    assert result.sha256 == hashlib.sha256(small_gguf).hexdigest()
    assert events[-1]["completed"] == events[-1]["total"] == len(small_gguf)


def test_resume_after_cut_connection(tmp_path: Path) -> None:
    server = FileServer({"big.gguf": DATA})
    server.cut["big.gguf"] = 1_000_000
    staging = tmp_path / "stage"
    staging.mkdir()
    with server.run() as base:
        result = fetch(_req(f"{base}/big.gguf", tmp_path, sha256=SHA), staging, None)
    assert result.sha256 == SHA
    assert (staging / "big.gguf").read_bytes() == DATA
    # The second request asked only for what was missing.
    assert server.ranges[0] is None
    assert server.ranges[1] is not None and server.ranges[1].startswith("bytes=")
    assert int(server.ranges[1].split("=")[1].rstrip("-")) >= 1_000_000 - 65536


def test_partial_file_from_an_earlier_attempt_is_resumed(tmp_path: Path) -> None:
    server = FileServer({"big.gguf": DATA})
    staging = tmp_path / "stage"
    staging.mkdir()
    with server.run() as base:
        url = f"{base}/big.gguf"
        resume = tmp_path / "resume"
        resume.mkdir()
        part = resume / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}.part"
        part.write_bytes(DATA[:2_000_000])
        result = fetch(_req(url, tmp_path, sha256=SHA), staging, None)
    assert result.sha256 == SHA
    assert server.ranges == ["bytes=2000000-"]
    assert not part.exists()


def test_wrong_sha256_is_rejected_and_nothing_is_left(tmp_path: Path) -> None:
    server = FileServer({"big.gguf": DATA})
    staging = tmp_path / "stage"
    staging.mkdir()
    with server.run() as base, pytest.raises(VerificationFailed) as info:
        fetch(_req(f"{base}/big.gguf", tmp_path, sha256="0" * 64), staging, None)
    assert "sha256 mismatch" in str(info.value)
    assert list(staging.iterdir()) == []
    assert list((tmp_path / "resume").iterdir()) == []


def test_missing_file_unreachable_host_and_bad_url(tmp_path: Path) -> None:
    server = FileServer({})
    with server.run() as base, pytest.raises(NotFound):
        fetch(_req(f"{base}/nope.gguf", tmp_path), tmp_path, None)
    with pytest.raises(SourceUnreachable) as info:
        fetch(_req("http://127.0.0.1:9/x.gguf", tmp_path), tmp_path, None)
    assert "127.0.0.1:9" in str(info.value)
    with pytest.raises(BadRequest):
        fetch(_req("ftp://example.invalid/x.gguf", tmp_path), tmp_path, None)
