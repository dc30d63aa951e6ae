"""Configuration precedence: conch.toml < CONCH_* environment < explicit overrides (CLI flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import load_settings


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in ("CONCH_PORT", "CONCH_DATA_DIR", "CONCH_API_KEY", "CONCH_CONFIG", "CONCH_ALLOW_NETWORK"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_defaults_without_file(clean_env: Path) -> None:
    s = load_settings(clean_env / "missing.toml")
    assert s.port == 3000
    assert s.models_port == 8080
    assert s.host == "127.0.0.1"
    assert s.enable_openapi is True
    assert s.allow_network is False


def test_file_then_env_then_flags(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = clean_env / "conch.toml"
    cfg.write_text('port = 4000\nmodels_port = 9000\nallow_network = true\n[providers.vllm]\nurl = "http://127.0.0.1:8000/v1"\n')
    s = load_settings(cfg)
    assert (s.port, s.models_port, s.allow_network) == (4000, 9000, True)
    assert s.providers["vllm"].url == "http://127.0.0.1:8000/v1"

    monkeypatch.setenv("CONCH_PORT", "5000")
    s = load_settings(cfg)
    assert s.port == 5000 and s.models_port == 9000

    s = load_settings(cfg, port=6000)
    assert s.port == 6000


def test_data_dir_override_and_derived_paths(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCH_DATA_DIR", str(clean_env / "data"))
    s = load_settings(clean_env / "missing.toml")
    assert s.data_dir == clean_env / "data"
    assert s.models_dir == clean_env / "data" / "models"
    assert s.workspace_dir == clean_env / "data" / "workspace"
    assert s.effective_database_url == f"sqlite:///{clean_env / 'data' / 'conch.db'}"
    s.ensure_dirs()
    assert s.tmp_dir.is_dir() and s.cache_dir.is_dir()


def test_secrets_are_masked(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCH_API_KEY", "s3cret")
    shown = load_settings(clean_env / "missing.toml").public_dict()
    assert shown["api_key"] == "***"
    assert "s3cret" not in str(shown)


def test_invalid_value_is_reported(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("CONCH_PORT", "not-a-port")
    with pytest.raises(ValidationError) as info:
        load_settings(clean_env / "missing.toml")
    assert "port" in str(info.value)
