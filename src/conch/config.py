"""Configuration: ``conch.toml``, overridden by ``CONCH_*`` variables, overridden by CLI flags.

The file is ``--config PATH`` when given, else ``$CONCH_CONFIG``, else
``<user config dir>/conch.toml``. The data directory is ``$CONCH_DATA_DIR`` or the
platform's user data directory.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, Field, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

APP_NAME = "conch"


def default_config_path() -> Path:
    env = os.environ.get("CONCH_CONFIG")
    if env:
        return Path(env)
    return Path(platformdirs.user_config_dir(APP_NAME)) / "conch.toml"


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


# What ``[providers.NAME] kind = ...`` may say; conch.inference.models.ref builds on it.
# It lives here, not there, so that reading the settings never imports conch.inference (which
# maps llama.cpp's libraries into the process).
RemoteProviderKind = Literal["ollama", "openai", "anthropic", "openai_compatible"]


class ProviderConfig(BaseModel):
    """A remote model provider (``[providers.NAME]`` in conch.toml)."""

    kind: RemoteProviderKind = "openai_compatible"
    url: str | None = None
    api_key: str | None = None
    enabled: bool = True
    # Name of an environment variable holding the key, so conch.toml need not hold secrets.
    api_key_env: str | None = None
    timeout_s: float | None = None  # longest silence before a 504 (default: provider_timeout_s)


class ModelOverrides(BaseModel):
    """Per-model runtime settings (``[model_overrides.ID]`` in conch.toml); unset ones inherit."""

    n_gpu_layers: int | None = None
    main_gpu: int | None = None
    flash_attn: Literal["auto", "on", "off"] | None = None
    kv_cache_type: Literal["f16", "q8_0"] | None = None
    n_ubatch: int | None = None
    n_batch: int | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    batch_invariant: bool | None = None
    # Another local GGUF model (its id) proposing speculative drafts for this one; it must
    # share this model's vocabulary (docs/inference.md, "Speculative decoding").
    draft_model: str | None = None
    # The vision projector GGUF (llama-server's --mmproj): an absolute path, or one relative to
    # the model file's directory; it overrides the one learned at download (docs/inference.md, "Images").
    mmproj: str | None = None


def parse_id_range(text: str) -> range:
    """``"FIRST-LAST"`` (``sandbox_uids``) as a range of ids; ``ValueError`` naming what is
    wrong. Root (0) and the ids the kernel reserves (``-1``, ``-2`` as unsigned) are never in it."""
    first, sep, last = text.strip().partition("-")
    try:
        low, high = int(first), int(last if sep else first)
    except ValueError:
        raise ValueError(f"sandbox_uids {text!r} is not FIRST-LAST (e.g. 60000-60999)") from None
    if not 0 < low <= high < 2**32 - 2:
        raise ValueError(f"sandbox_uids {text!r}: ids must be 1 to {2**32 - 3}, first <= last")
    return range(low, high + 1)


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
    # A log line per HTTP request on both servers (off: a line costs ~0.1 ms of a request
    # that may take 0.3 ms; errors and start-up are logged either way).
    access_log: bool = False

    # agent and code-execution server
    host: str = "127.0.0.1"
    port: int = 3000
    workers: int = 2
    api_key: str | None = None  # acts as the admin key (below); kept for single-user installs
    # The key that manages keys (docs/security.md); CONCH_ADMIN_KEY. Both servers accept it.
    admin_key: str | None = None
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
    # The kernel layers under the language's checks (conch.sandbox.layers, docs/agent-server.md):
    # "best-effort" applies every layer the machine offers and reports the missing ones,
    # "strict" refuses to start without Landlock, seccomp and an unprivileged worker user.
    sandbox: Literal["strict", "best-effort", "off"] = "best-effort"
    # Who workers run as when the server runs as root: a uid of its own per worker from
    # sandbox_uids ("FIRST-LAST", leased machine-wide with a lock file per id, so that two
    # servers never share one), the server's workers sharing a group from the same range;
    # sandbox_user where the range is empty ("") or has no free id.
    sandbox_uids: str = "60000-60999"
    sandbox_user: str = "nobody"
    worker_pids_max: int = 64  # processes per worker (cgroup pids.max, or RLIMIT_NPROC)
    worker_files_max: int = 1024  # open files per process of a worker (RLIMIT_NOFILE)
    worker_file_mb: int = 4096  # the largest file a worker or its commands may write (RLIMIT_FSIZE)
    default_model: str = "local:smollm2-135m-instruct"
    marketplace_url: str | None = None
    executor: str = "local"
    dask_scheduler: str | None = None

    # sessions (docs/sessions.md): each one's workspace and saved bindings live under
    # sessions_dir (default <data_dir>/sessions; servers sharing a database share it too). An
    # idle session is paused after session_idle_s; a create without ttl_s lives session_ttl_s
    # past its last use. Its files may take session_disk_mb, one upload session_upload_mb
    # (the files route's own limit: max_body_bytes is for JSON bodies).
    sessions_dir: Path = Field(default=None)  # type: ignore[assignment]  # see _sessions_dir_default
    session_idle_s: float = 300.0
    session_ttl_s: float = 86_400.0
    session_disk_mb: int = 512
    session_upload_mb: int = 100
    # Warm sandbox workers kept waiting for a session (imports done, not yet confined): a
    # session's first run binds one in milliseconds instead of starting a process.
    session_spares: int = 2
    # The most sessions this server keeps a worker for; past it the one idle longest is
    # paused early (a paused session costs disk, a warm one a process).
    session_workers_max: int = 100
    # The agent tasks of a thread share a session of their own (its files, its variables),
    # made with the thread's first task; off: they run in the shared workspace, statelessly,
    # as tasks without a thread do.
    thread_sessions: bool = True

    # model inference server
    models_host: str = "127.0.0.1"
    models_port: int = 8080
    enable_openapi: bool = True
    keep_alive_s: float = 300.0
    max_loaded_models: int = 2
    # What the loaded models may hold together, in MB (docs/inference.md, "Many models under a
    # memory budget"). None: 80 % of the memory free when the server starts, MemAvailable's RAM,
    # or the GPUs' free memory where llama.cpp offloads models to a GPU.
    memory_budget_mb: int | None = None
    # How long a request for a model that does not fit (everything loaded is busy) waits for
    # memory to free before it is answered 503 insufficient_memory.
    memory_wait_s: float = 60.0
    max_queue: int = 64
    # The context: one KV pool of n_ctx cells shared by every sequence (any one may use it all).
    # 0: the model's training context (its GGUF metadata), as llama-server's `-c 0` default,
    # lowered by the loader when it does not fit memory (docs/inference.md, "Context").
    n_ctx: int = 0
    n_threads: int | None = None  # None: one per physical core, as llama-server (docs/inference.md)
    n_threads_batch: int | None = None  # prompt and multi-sequence steps; None: as n_threads
    n_parallel: int = 4
    cache_prompt: bool = True  # reuse KV of shared prompt prefixes (bitwise the same output, faster first token)
    # Speculative decoding (n-gram drafts from the prompt and the text so far, and a
    # model_overrides draft_model): at most this many tokens drafted per sequence and step; each
    # request drafts only as long and as often as its drafts are kept often enough to pay
    # (docs/inference.md, "Speculative decoding"). 0 turns drafting off.
    draft_max: int = 32
    # Prompt prefixes of prompt_cache_min_tokens or more keep their KV under <data_dir>/kv-cache
    # across restarts, least recently used deleted past prompt_cache_disk_mb (0: off; docs/inference.md).
    prompt_cache_disk_mb: int = 512
    prompt_cache_min_tokens: int = 256
    hf_endpoint: str | None = None
    hf_token: str | None = None
    ollama_url: str = "http://127.0.0.1:11434"
    # Where the `ollama` download source pulls from (an OCI registry, not a running Ollama).
    ollama_registry: str = "https://registry.ollama.ai"
    openai_api_key: str | None = None
    anthropic_api_key: str | None = None
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    # orchestration (agent server): models are reached only through the inference server's
    # OpenAI-compatible API (`models_url`); observations sent back to the model are truncated
    agent_observation_chars: int = 4000
    # how long a server's claim on a running task or workflow step lasts without renewal
    # (after a crash another server, or this one restarted, takes the work over)
    orchestration_lease_s: float = 15.0
    orchestration_max_concurrent_steps: int = 64
    # agent tasks running at once on this server; the others stay pending in order
    orchestration_max_concurrent_tasks: int = 16
    # an agent task whose model server (or its provider) is not up yet (no connection, 502,
    # 503, 504) asks again with backoff for this long before it fails with ProviderError
    model_retry_s: float = Field(default=30.0, ge=0)
    # agent tool calls: {default, effects: {EFFECT: RULE}, tools: {BUILTIN: RULE}}, RULE one
    # of allow | ask | deny (docs/orchestration.md); agents and tasks override it. Empty:
    # every call runs. A call waiting for approval longer than approval_timeout_s is rejected.
    approvals: dict[str, Any] = Field(default_factory=dict)
    approval_timeout_s: float | None = None

    # marketplace federation: the upstream is `marketplace_url`
    marketplace_api_key: str | None = None  # bearer key for the upstream marketplace
    marketplace_timeout_s: float = 2.0  # an upstream slower than this is left out, with a note

    # GPU offload of llama.cpp models (docs/gpu.md). n_gpu_layers: None offloads every layer when
    # llama.cpp has a GPU backend compiled in and none otherwise; -1 is every layer, 0 the CPU.
    n_gpu_layers: int | None = None
    main_gpu: int = 0
    # auto: llama.cpp's choice on a GPU, on on the CPU ("off" there: faster for one stream,
    # slower for several; docs/inference.md, "Which attention").
    flash_attn: Literal["auto", "on", "off"] = "auto"
    kv_cache_type: Literal["f16", "q8_0"] = "f16"
    # llama.cpp's micro-batch (n_ubatch). None: 512, as llama-server; 63 on the CPU with
    # batch_invariant (docs/inference.md, "Prefill and prefix reuse").
    n_ubatch: int | None = None
    # Every token's logits bitwise the same however its prompt was split, reused or restored
    # (CPU: micro-batches under 64 rows, ggml's reference kernels). Off: prompts prefill in
    # llama-server's 512-row micro-batches (~1.5x faster on the CPU) and a reused prefix holds
    # a fresh prefill's KV up to the kernels' rounding: the same greedy tokens except that an
    # answer may take the other branch at a near-tie (docs/inference.md).
    batch_invariant: bool = False
    # Prompt tokens per step (llama.cpp's n_batch, llama-server's -b). None: 2048 on a GPU, 512 on
    # the CPU (docs/inference.md, "Defaults").
    n_batch: int | None = None
    # Per-model overrides of the settings above (and n_ctx), keyed by model id:
    # [model_overrides."smollm2-135m-instruct"] n_gpu_layers = 0
    model_overrides: dict[str, ModelOverrides] = Field(default_factory=dict)

    # providers, and the ai/embed/http builtins
    # The inference server's OpenAI base URL: where the agent server's sandbox workers (and a
    # shell that sets it) send ai()/embed() requests. `conch up` sets it to its own server.
    models_url: str = "http://127.0.0.1:8080/v1"
    allow_model: bool = True  # the `model` effect (ai, embed) in the agent server
    # Hosts, IPs or CIDRs that http_* may reach from the agent server although they are
    # private, loopback or link-local (refused by default once allow_network is on).
    network_allow: list[str] = Field(default_factory=list)
    provider_probe_interval_s: float = 30.0  # background health probe of remote providers
    provider_probe_timeout_s: float = 2.0  # one probe / one model listing, bounded
    provider_connect_timeout_s: float = 5.0
    provider_timeout_s: float = 120.0  # longest silence from a provider before a 504
    provider_models_ttl_s: float = 60.0  # the merged /v1/models cache
    http_timeout_s: float = 30.0  # http_* builtins: default and, in the server, the maximum
    http_max_bytes: int = 10 * 1024 * 1024  # http_* response bodies are cut (an error) past this

    @field_validator("sessions_dir", mode="before")
    @classmethod
    def _sessions_dir_default(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            return value
        return Path(info.data.get("data_dir") or _default_data_dir()) / "sessions"

    @field_validator("sandbox_uids")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        value = value.strip()
        if value:
            parse_id_range(value)
        return value

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
    def workspace_dir(self) -> Path:
        return self.workspace or (self.data_dir / "workspace")

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'conch.db'}"

    def ensure_dirs(self) -> None:
        make_data_dir(self.data_dir)
        for d in (self.models_dir, self.cache_dir, self.tmp_dir, self.data_dir / "kv-cache"):
            make_private_dir(d)

    def public_dict(self) -> dict[str, Any]:
        """The effective configuration with secrets masked (``conch config show``)."""
        data = self.model_dump(mode="json")
        for key in ("api_key", "admin_key", "hf_token", "openai_api_key", "anthropic_api_key", "marketplace_api_key"):
            if data.get(key):
                data[key] = "***"
        for prov in data.get("providers", {}).values():
            if prov.get("api_key"):
                prov["api_key"] = "***"
        data["config_file"] = str(_config_file_for_load)
        return data


_config_file_for_load: Path = default_config_path()


def config_file() -> Path:
    """The ``conch.toml`` these settings were (or would be) read from."""
    return _config_file_for_load


# What the server creates beneath its data directory is its owner's alone: the database
# (with its WAL and journal, which SQLite creates with the database's own mode), a
# ``conch.toml`` conch writes, prompt caches, models. Nothing there is for a sandbox worker,
# which runs as another user; a hard link planted in the workspace must read as
# ``PermissionError``. The data directory itself is 0711: searchable, so that workers reach a
# workspace beneath it, but not listable.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
DATA_DIR_MODE = 0o711


def make_private_dir(path: Path, mode: int = PRIVATE_DIR_MODE) -> None:
    """Create ``path`` with ``mode`` (whatever the umask) where it does not exist; missing
    parents get the default mode. An existing directory is left as it is."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode)
    except FileExistsError:
        return
    os.chmod(path, mode)


def make_data_dir(path: Path) -> None:
    make_private_dir(path, DATA_DIR_MODE)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (``conch.toml``, keys), created so from the start
    rather than narrowed after: there is no moment at which another user could open it."""
    make_private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), PRIVATE_FILE_MODE)  # an existing file keeps its mode otherwise
        fh.write(text)


def readable_by_others(path: Path) -> str | None:
    """Why ``path`` (an existing config or database) can be read by users other than its
    owner; ``None`` where it cannot or does not exist."""
    import stat

    try:
        st = path.stat()
    except OSError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o044 == 0:
        return None
    who = " and ".join(w for w, bit in (("its group", 0o040), ("every user", 0o004)) if mode & bit)
    return f"{path} is mode {mode:04o}: readable by {who} (chmod 600 {path})"


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
