"""The sandbox worker's environment is an allowlist, and its settings carry no secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import ProviderConfig, Settings
from conch.sandbox.worker_env import ALLOWED_ENV, worker_environment, worker_settings


def test_only_allowlisted_variables_pass() -> None:
    environ = {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "TZ": "UTC",
               "DATABASE_URL": "postgres://u:pw@host/db", "AWS_SECRET_ACCESS_KEY": "x",
               "CONCH_API_KEY": "k", "SOME_SERVICE_URL": "https://u:p@x"}
    env = worker_environment(Settings(), environ)
    assert env == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "TZ": "UTC"}
    assert set(env) <= set(ALLOWED_ENV)


def test_the_import_path_is_the_servers_wherever_the_worker_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    env = worker_environment(Settings(), {"PYTHONPATH": "src::/opt/lib"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'src'}:/opt/lib"


def test_worker_settings_drop_every_secret(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_key="a", openai_api_key="sk-o", anthropic_api_key="sk-a",
                        hf_token="hf_secret_token", database_url="postgresql://u:pw@h/db",
                        admin_key="ck-admin-secret", marketplace_api_key="mk-upstream-secret",
                        providers={"x": ProviderConfig(url="http://h/v1", api_key="sk-x")})
    text = worker_settings(settings).model_dump_json()
    for secret in ("sk-o", "sk-a", "hf_secret_token", "pw@h", "sk-x", "ck-admin-secret",
                   "mk-upstream-secret"):
        assert secret not in text
    assert worker_settings(settings).models_url == settings.models_url


def test_server_env_cannot_read_a_database_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.web.agent_fixtures import start_agent_server

    monkeypatch.setenv("DATABASE_URL", "postgres://u:pw@host/db")
    monkeypatch.setenv("TZ", "UTC")
    server = start_agent_server(tmp_path, workers=1)
    try:
        with server.client() as c:
            body = c.post("/api/v1/eval", json={"code": 'env("DATABASE_URL", default="absent")'}).json()
            keys = c.post("/api/v1/eval", json={"code": "env() | keys"}).json()
        assert body["value"] == "absent"
        assert set(keys["value"]) <= set(ALLOWED_ENV) and "TZ" in keys["value"]
    finally:
        server.stop()
