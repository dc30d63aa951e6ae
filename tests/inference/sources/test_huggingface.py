"""The huggingface source against a loopback server speaking the Hub's HTTP API."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conch.inference.models.sources import FetchRequest, NotFound, SourceUnreachable, fetch
from conch.inference.models.sources.huggingface import select_files
from tests.inference.sources.servers import HubRepo, HubServer

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
GGUF_REPO = "conch-test/tiny-GGUF"


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture
def hub(minilm_files: dict[str, bytes], small_gguf: bytes) -> HubServer:
    minilm = HubRepo(dict(minilm_files))
    minilm.branches["v1"] = minilm.commit
    ggufs = HubRepo({
        "README.md": b"# tiny\n",
        "tiny.Q8_0.gguf": small_gguf,
        "tiny.Q4_K_M.gguf": small_gguf + b"",
        "tiny.F16.gguf": small_gguf,
    })
    return HubServer({MINILM_REPO: minilm, GGUF_REPO: ggufs})


def _request(endpoint: str, **kw: object) -> FetchRequest:
    return FetchRequest(model_id="m", source="huggingface", endpoint=endpoint, **kw)  # type: ignore[arg-type]


def test_safetensors_repo_downloads_config_tokenizer_and_weights(
    hub: HubServer, minilm_files: dict[str, bytes], tmp_path: Path
) -> None:
    events: list[dict[str, object]] = []
    with hub.run() as endpoint:
        result = fetch(_request(endpoint, repo=MINILM_REPO, revision="main"), tmp_path, events.append)
    assert result.format == "safetensors"
    assert result.revision == hub.repos[MINILM_REPO].commit
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "modules.json",
                 "1_Pooling/config.json"):
        assert name in result.files
        assert (tmp_path / name).read_bytes() == minilm_files[name]
    assert "data_config.json" not in result.files  # not part of the model
    assert not (tmp_path / ".cache").exists()
    assert events and all({"status", "completed", "total"} <= e.keys() for e in events)
    assert any(e["completed"] == e["total"] and e["total"] for e in events)
    # Every file was fetched at the resolved commit, never at the moving branch name.
    resolves = [p for _m, p in hub.requests if "/resolve/" in p]
    assert resolves and all(f"/resolve/{result.revision}/" in p for p in resolves)


def test_revision_by_tag_or_commit(hub: HubServer, tmp_path: Path) -> None:
    commit = hub.repos[MINILM_REPO].commit
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with hub.run() as endpoint:
        by_tag = fetch(_request(endpoint, repo=MINILM_REPO, revision="v1", files=["model.safetensors"]),
                       tmp_path / "a", None)
        by_commit = fetch(_request(endpoint, repo=MINILM_REPO, revision=commit,
                                   files=["*.safetensors"]), tmp_path / "b", None)
    assert by_tag.revision == commit
    assert by_commit.revision == commit
    # A safetensors pick brings its config and tokenizer along.
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(by_commit.files)


def test_files_glob_picks_one_gguf(hub: HubServer, small_gguf: bytes, tmp_path: Path) -> None:
    with hub.run() as endpoint:
        result = fetch(_request(endpoint, repo=GGUF_REPO, files=["*Q8_0.gguf"]), tmp_path, None)
    assert result.files == ["tiny.Q8_0.gguf"]
    assert result.format == "gguf" and result.path == "tiny.Q8_0.gguf"
    assert result.sha256 == hashlib.sha256(small_gguf).hexdigest()


def test_default_pick_among_many_ggufs_is_q4_k_m() -> None:
    assert select_files(["a.F16.gguf", "a.Q4_K_M.gguf", "a.Q8_0.gguf", "README.md"], None) == [
        "a.Q4_K_M.gguf"
    ]


def test_unknown_repo_revision_and_file_are_not_found(hub: HubServer, tmp_path: Path) -> None:
    with hub.run() as endpoint:
        with pytest.raises(NotFound):
            fetch(_request(endpoint, repo="nobody/nothing"), tmp_path, None)
        with pytest.raises(NotFound):
            fetch(_request(endpoint, repo=MINILM_REPO, revision="no-such-branch"), tmp_path, None)
        with pytest.raises(NotFound):
            fetch(_request(endpoint, repo=GGUF_REPO, files=["*.Q2_K.gguf"]), tmp_path, None)


def test_unreachable_endpoint_names_the_cause(tmp_path: Path) -> None:
    with pytest.raises(SourceUnreachable) as info:
        fetch(_request("http://127.0.0.1:9", repo=MINILM_REPO), tmp_path, None)
    assert "127.0.0.1:9" in str(info.value)
