"""Configuration: ``conch.toml``, overridden by ``CONCH_*`` variables, overridden by CLI flags.

The file is ``--config PATH`` when given, else ``$CONCH_CONFIG``, else
``<user config dir>/conch.toml``. The data directory is ``$CONCH_DATA_DIR`` or the
platform's user data directory.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from conch.inference.providers.kinds import RemoteProviderKind

APP_NAME = "conch"


def default_config_path() -> Path:
    env = os.environ.get("CONCH_CONFIG")
    if env:
        return Path(env)
    return Path(platformdirs.user_config_dir(APP_NAME)) / "conch.toml"


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


class ProviderConfig(BaseModel):
    """A remote model provider (``[providers.NAME]`` in conch.toml)."""

    kind: RemoteProviderKind = "openai_compatible"
    url: str | None = None
    api_key: str | None = None
    enabled: bool = True


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONCH_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    # where things live
    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = None

    # agent and code-execution server
    host: str = "127.0.0.1"
    port: int = 3000
    workers: int = 2
    api_key: str | None = None
    workspace: Path | None = None
    allow_network: bool = False
    allow_process: bool = False
    max_body_bytes: int = 1_048_576
    wall_time_s: float = 30.0
    stream_wall_time_s: float = 300.0
    max_steps: int = 50_000_000
    max_recursion: int = 1000
    max_output_bytes: int = 10 * 1024 * 1024
    max_collection_size: int = 10_000_000
    worker_memory_mb: int = 1024
    default_model: str = "local:smollm2-135m-instruct"
    marketplace_url: str | None = None
    executor: str = "local"
    dask_scheduler: str | None = None

    # model inference server
    models_host: str = "127.0.0.1"
    models_port: int = 8080
    enable_openapi: bool = True
    keep_alive_s: float = 300.0
    max_loaded_models: int = 2
    max_queue: int = 64
    n_ctx: int = 2048
    n_threads: int | None = None
    n_threads_batch: int | None = None  # prompt and multi-sequence steps; default: all CPUs
    n_parallel: int = 4
    cache_prompt: bool = True  # reuse KV of shared prompt prefixes (bitwise the same output, faster first token)
    hf_endpoint: str | None = None
    hf_token: str | None = None
    ollama_url: str = "http://127.0.0.1:11434"
    # Where the `ollama` download source pulls from (an OCI registry, not a running Ollama).
    ollama_registry: str = "https://registry.ollama.ai"
    openai_api_key: str | None = None
    anthropic_api_key: str | None = None
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_config_file_for_load)
        # Precedence, highest first: CLI flags (init), environment, conch.toml.
        return (init_settings, env_settings, toml)

    # -- derived paths ---------------------------------------------------------------------
    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def tmp_dir(self) -> Path:
        return self.data_dir / "tmp"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "conch.db"

    @property
    def workspace_dir(self) -> Path:
        return self.workspace or (self.data_dir / "workspace")

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.db_path}"

    def ensure_dirs(self) -> None:
        for d in (self.data_dir, self.models_dir, self.cache_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)

    def public_dict(self) -> dict[str, Any]:
        """The effective configuration with secrets masked (``conch config show``)."""
        data = self.model_dump(mode="json")
        for key in ("api_key", "hf_token", "openai_api_key", "anthropic_api_key"):
            if data.get(key):
                data[key] = "***"
        for prov in data.get("providers", {}).values():
            if prov.get("api_key"):
                prov["api_key"] = "***"
        data["config_file"] = str(_config_file_for_load)
        return data


_config_file_for_load: Path = default_config_path()


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build settings from the file, the environment and explicit overrides (CLI flags)."""
    global _config_file_for_load
    _config_file_for_load = Path(config_file) if config_file else default_config_path()
    clean = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, loaded once."""
    return load_settings()
