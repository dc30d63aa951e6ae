"""The model store: registry rows in SQLite, files under models_dir, atomic installs, cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.models.bundled import BUNDLED_ID, ensure_bundled_model
from conch.inference.models.store import ModelRecord, ModelStore, safe_dir_name


def test_safe_dir_names_are_distinct_and_flat() -> None:
    assert safe_dir_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB--SmolLM2-135M"
    assert "/" not in safe_dir_name("a/b/c")
    assert safe_dir_name("a b") != safe_dir_name("a_b")
    assert safe_dir_name("..") not in ("..", ".", "")


def test_register_get_list_update(inference_settings: Settings) -> None:
    store = ModelStore(inference_settings)
    assert store.list() == []
    rec = ModelRecord(id="org/model", path="/nowhere/model.gguf", size_bytes=10, architecture="llama", context_length=128)
    store.register(rec)
    got = store.get("org/model")
    assert got is not None and got.architecture == "llama" and got.context_length == 128 and got.owned_by == "local"
    store.register(rec.model_copy(update={"size_bytes": 20}))
    assert [r.size_bytes for r in store.list()] == [20]
    store.set_status("org/model", "downloading", progress=0.5)
    got = store.get("org/model")
    assert got is not None and got.status == "downloading" and got.progress == 0.5
    with pytest.raises(ValueError):
        store.set_status("org/model", "sleeping")
    with pytest.raises(KeyError):
        store.set_status("missing", "ready")
    # a second store on the same database sees the same rows
    assert ModelStore(inference_settings).get("org/model") is not None


def test_install_dir_moves_then_registers(inference_settings: Settings) -> None:
    store = ModelStore(inference_settings)
    staged = store.staging_dir("org/model")
    assert staged.parent == inference_settings.tmp_dir
    (staged / "model.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    (staged / "tokenizer.json").write_text("{}")
    rec = store.install_dir("org/model", staged, ModelRecord(id="org/model", path="model.gguf", status="downloading"))
    target = inference_settings.models_dir / "org--model"
    assert not staged.exists() and target.is_dir()
    assert rec.path == str(target / "model.gguf") and rec.status == "ready"
    assert rec.size_bytes == 106 and sorted(rec.files) == ["model.gguf", "tokenizer.json"]
    assert store.get("org/model") == rec
    # reinstalling replaces the directory whole
    staged2 = store.staging_dir("org/model")
    (staged2 / "model.gguf").write_bytes(b"GGUF2")
    rec2 = store.install_dir("org/model", staged2, ModelRecord(id="org/model", path=str(staged2 / "model.gguf")))
    assert rec2.size_bytes == 5 and not (target / "tokenizer.json").exists()


def test_delete_removes_managed_files_but_never_linked_ones(inference_settings: Settings, tmp_path: Path) -> None:
    store = ModelStore(inference_settings)
    staged = store.staging_dir("m")
    (staged / "w.gguf").write_bytes(b"x")
    store.install_dir("m", staged, ModelRecord(id="m", path="w.gguf"))
    store.delete("m")
    assert store.get("m") is None and not (inference_settings.models_dir / "m").exists()

    outside = tmp_path / "external.gguf"
    outside.write_bytes(b"keep me")
    store.register(ModelRecord(id="linked", path=str(outside)))
    store.delete("linked")
    assert store.get("linked") is None and outside.read_bytes() == b"keep me"
    with pytest.raises(KeyError):
        store.delete("linked")


def test_stats_and_cleanup_never_touch_ready_models(inference_settings: Settings) -> None:
    store = ModelStore(inference_settings)
    staged = store.staging_dir("ready-one")
    (staged / "w.gguf").write_bytes(b"x" * 300)
    store.install_dir("ready-one", staged, ModelRecord(id="ready-one", path="w.gguf"))
    partial = store.staging_dir("half")
    (partial / "w.gguf").write_bytes(b"y" * 200)
    busy = store.staging_dir("busy")
    (busy / "w.gguf").write_bytes(b"z" * 50)
    store.register(ModelRecord(id="busy", status="downloading"))
    (inference_settings.cache_dir / "c").write_bytes(b"c" * 100)

    stats = store.stats()
    assert stats.model_count == 2 and stats.total_size_bytes == 300
    assert stats.cache_size_bytes == 350 and stats.storage_path == str(inference_settings.models_dir)

    freed, removed = store.cleanup()
    assert freed == 300 and str(partial) in removed and busy.exists()
    assert (inference_settings.models_dir / "ready-one" / "w.gguf").exists()
    assert store.get("ready-one") is not None


def test_bundled_model_registered_once_with_cached_hash(inference_settings: Settings, smollm2_path: Path) -> None:
    store = ModelStore(inference_settings)
    rec = ensure_bundled_model(store)
    assert rec is not None and rec.id == BUNDLED_ID and rec.path == str(smollm2_path)
    assert rec.architecture == "llama" and rec.quantization == "Q4_1" and rec.context_length == 8192
    assert rec.sha256 is not None and len(rec.sha256) == 64
    assert rec.size_bytes == smollm2_path.stat().st_size
    # linked, not copied
    assert not any(inference_settings.models_dir.iterdir())
    again = ensure_bundled_model(store)
    assert again == rec
    store.delete(BUNDLED_ID)
    assert smollm2_path.is_file()


def test_bundled_model_not_added_when_a_chat_model_exists(inference_settings: Settings, smollm2_path: Path) -> None:
    store = ModelStore(inference_settings)
    store.register(ModelRecord(id="my-chat", path=str(smollm2_path), capabilities=["chat"]))
    assert ensure_bundled_model(store) is None
    assert store.get(BUNDLED_ID) is None
