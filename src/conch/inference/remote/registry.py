"""The providers of one server: built from settings, routed by model string, probed in the
background, their model lists cached.

Model strings are ``"<provider>:<model>"`` split at the first colon, so ``ollama:qwen2.5:7b``
is provider ``ollama``, model ``qwen2.5:7b``; a string whose prefix names no provider (or
``local:``) is a local model, and :meth:`ProviderRegistry.route` answers ``None`` for it.

A probe is a real round trip (listing models, bounded by ``provider_probe_timeout_s``). Its
result is the provider's status and its model list at once; ``/v1/models`` answers from the
last lists and refreshes stale ones in the background, so a provider that is down never
slows it (an unreachable provider keeps its last known list).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from conch.config import ProviderConfig, Settings
from conch.inference.models.ref import LOCAL, REMOTE_PROVIDER_KINDS, ModelRef
from conch.inference.remote.anthropic import AnthropicProvider
from conch.inference.remote.base import Provider, Timeouts
from conch.inference.remote.errors import (
    NoModelNamed,
    ProviderError,
    ProviderUnavailable,
    UnknownProvider,
)
from conch.inference.remote.ollama import OllamaProvider
from conch.inference.remote.openai_compat import OPENAI_URL, OpenAICompatProvider

log = logging.getLogger(__name__)



@dataclass
class ProbeState:
    ok: bool | None = None  # None: not probed yet
    checked_at: float = 0.0
    models: list[str] = field(default_factory=list)
    error: str | None = None
    latency_ms: int | None = None
    listed_at: int = 0  # Unix time of the last successful listing (the models' ``created``)


def build_provider(name: str, config: ProviderConfig, settings: Settings) -> Provider:
    timeouts = Timeouts(connect_s=settings.provider_connect_timeout_s,
                        read_s=config.timeout_s or settings.provider_timeout_s,
                        probe_s=settings.provider_probe_timeout_s)
    key = config.api_key or (os.environ.get(config.api_key_env) if config.api_key_env else None)
    kind = config.kind
    if kind == "ollama":
        return OllamaProvider(name, config.url, timeouts)
    if kind == "anthropic":
        return AnthropicProvider(name, config.url, key, timeouts)
    if kind == "openai":
        return OpenAICompatProvider(name, config.url or OPENAI_URL, key, timeouts,
                                    kind="openai", key_required=True)
    if kind == "openai_compatible":
        if not config.url:
            raise ValueError(f"[providers.{name}] needs a url (an OpenAI-compatible base URL)")
        return OpenAICompatProvider(name, config.url, key, timeouts)
    raise ValueError(f"[providers.{name}] kind must be one of {', '.join(REMOTE_PROVIDER_KINDS)}, not {kind!r}")


def provider_configs(settings: Settings) -> dict[str, ProviderConfig]:
    """Every provider's configuration: the three built in (``ollama`` at its default URL,
    ``openai`` and ``anthropic`` with keys from settings or the environment), then each
    ``[providers.NAME]``; a table named like a built-in one overrides its fields."""
    configs: dict[str, ProviderConfig] = {
        "ollama": ProviderConfig(kind="ollama", url=settings.ollama_url),
        "openai": ProviderConfig(kind="openai", url=OPENAI_URL,
                                 api_key=settings.openai_api_key or os.environ.get("OPENAI_API_KEY")),
        "anthropic": ProviderConfig(kind="anthropic",
                                    api_key=settings.anthropic_api_key or os.environ.get("ANTHROPIC_API_KEY")),
    }
    for name, config in settings.providers.items():
        if name == LOCAL:
            raise ValueError("[providers.local] is reserved for conch's own models")
        base = configs.get(name)
        if base is not None:
            given = {k: v for k, v in config.model_dump(exclude_unset=True).items() if v is not None}
            configs[name] = base.model_copy(update=given)
        else:
            configs[name] = config
    return configs


class ProviderRegistry:
    """All providers of one server. ``local_models`` lists conch's own ready models (for
    validating ``local``); the local chat path itself lives in the serving layer."""

    def __init__(self, settings: Settings,
                 local_models: Callable[[], Awaitable[list[str]]] | None = None) -> None:
        self.settings = settings
        self.local_models = local_models
        self.providers: dict[str, Provider] = {}
        self.disabled: set[str] = set()
        for name, config in provider_configs(settings).items():
            self.providers[name] = build_provider(name, config, settings)
            if not config.enabled:
                self.disabled.add(name)
        self.state: dict[str, ProbeState] = {name: ProbeState() for name in self.providers}
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._probe_task: asyncio.Task[None] | None = None

    # -- routing -----------------------------------------------------------------------------
    def ids(self) -> list[str]:
        return [LOCAL, *self.providers]

    def route(self, model: str) -> tuple[Provider, str] | None:
        """``(provider, model name)`` for a remote model string, ``None`` for a local model.
        Raises :class:`ProviderUnavailable` for a provider that cannot serve (no key,
        disabled) so the caller answers 503 rather than looking for a local model."""
        ref = ModelRef.parse(model, self.providers)
        if ref.is_local:
            return None
        prefix, rest = ref.provider, ref.name
        provider = self.providers.get(prefix)
        if provider is None:
            return None  # a well-known kind not configured here: the local path says so
        if not rest:
            raise NoModelNamed(prefix, model)
        if prefix in self.disabled:
            raise ProviderUnavailable(prefix, f"provider '{prefix}' is disabled in the configuration")
        if not provider.configured():
            raise ProviderUnavailable(prefix, provider.unavailable_reason())
        return provider, rest

    def get(self, provider_id: str) -> Provider:
        provider = self.providers.get(provider_id)
        if provider is None:
            raise UnknownProvider(provider_id, self.ids())
        return provider

    def _active(self) -> list[Provider]:
        return [p for name, p in self.providers.items() if name not in self.disabled and p.configured()]

    # -- probing -----------------------------------------------------------------------------
    async def refresh(self, provider: Provider) -> ProbeState:
        """One real round trip: the provider's models, and so its status."""
        state = self.state[provider.id]
        started = time.perf_counter()
        try:
            models = await asyncio.wait_for(provider.list_models(provider.timeouts.probe_s),
                                            provider.timeouts.probe_s + 0.5)
        except (ProviderError, TimeoutError) as exc:
            state.ok = False
            state.error = exc.message if isinstance(exc, ProviderError) else \
                f"{provider.id}: no answer within {provider.timeouts.probe_s:g} s"
        else:
            state.ok = True
            state.models = models
            state.listed_at = int(time.time())
            state.error = None
        state.latency_ms = round((time.perf_counter() - started) * 1000)
        state.checked_at = time.monotonic()
        return state

    def _refresh_soon(self, provider: Provider) -> asyncio.Task[None]:
        """Start a refresh unless one is running (one at a time per provider)."""
        task = self._refreshing.get(provider.id)
        if task is None or task.done():
            async def run() -> None:
                await self.refresh(provider)

            task = asyncio.create_task(run())
            self._refreshing[provider.id] = task
        return task

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._refresh_soon(p) for p in self._active()), return_exceptions=True)

    async def start(self) -> None:
        """Probe now and then every ``provider_probe_interval_s`` in the background."""
        if self._probe_task is None and self.settings.provider_probe_interval_s > 0:
            self._probe_task = asyncio.create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            try:
                await self.probe_all()
            except Exception:  # a probe must never end the loop
                log.exception("provider probe failed")
            await asyncio.sleep(self.settings.provider_probe_interval_s)

    async def close(self) -> None:
        tasks = [t for t in (self._probe_task, *self._refreshing.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        self._probe_task = None
        for p in self.providers.values():
            with contextlib.suppress(Exception):
                await p.aclose()

    # -- what the routes answer ----------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """``[{id, status, url?}]`` for ``GET /v1/providers`` (never a key)."""
        out: list[dict[str, Any]] = [{"id": LOCAL, "status": "available"}]
        for name, p in self.providers.items():
            ok = self.state[name].ok is True and name not in self.disabled and p.configured()
            out.append({"id": name, "status": "available" if ok else "unavailable", "url": p.url})
        return out

    def status_map(self) -> dict[str, Literal["connected", "configured"]]:
        """``{id: connected|configured}`` for ``/v1/status``: connected when the last probe
        succeeded."""
        out: dict[str, Literal["connected", "configured"]] = {LOCAL: "connected"}
        for name in self.providers:
            out[name] = "connected" if self.state[name].ok is True and name not in self.disabled else "configured"
        return out

    async def validate(self, provider_id: str) -> dict[str, Any]:
        """A real round trip now: ``{provider, valid, latency_ms, models_available, error?}``.
        Raises :class:`UnknownProvider` for an id that is not configured."""
        if provider_id == LOCAL:
            started = time.perf_counter()
            models = await self.local_models() if self.local_models is not None else []
            return {"provider": LOCAL, "valid": True,
                    "latency_ms": round((time.perf_counter() - started) * 1000),
                    "models_available": len(models)}
        provider = self.get(provider_id)
        if provider_id in self.disabled or not provider.configured():
            reason = (f"provider '{provider_id}' is disabled in the configuration"
                      if provider_id in self.disabled else provider.unavailable_reason())
            return {"provider": provider_id, "valid": False, "latency_ms": 0,
                    "models_available": 0, "error": reason}
        state = await self.refresh(provider)
        out: dict[str, Any] = {"provider": provider_id, "valid": bool(state.ok),
                               "latency_ms": state.latency_ms or 0,
                               "models_available": len(state.models) if state.ok else 0}
        if not state.ok:
            out["error"] = state.error
        return out

    async def models(self) -> list[dict[str, Any]]:
        """The remote models for ``/v1/models``: ``{id: "<provider>:<model>", owned_by, created}``.

        Lists older than ``provider_models_ttl_s`` are refreshed in the background and the
        last known list is answered meanwhile; only a provider never listed before is
        waited for, and then at most ``provider_probe_timeout_s``."""
        ttl = self.settings.provider_models_ttl_s
        now = time.monotonic()
        waits: list[asyncio.Task[None]] = []
        for p in self._active():
            state = self.state[p.id]
            if state.checked_at == 0.0:
                waits.append(self._refresh_soon(p))
            elif now - state.checked_at > ttl:
                self._refresh_soon(p)
        if waits:
            # Bounded: the refresh itself is bounded, and shielded so a slow one keeps going
            # for the next caller rather than being cancelled.
            await asyncio.wait([asyncio.shield(t) for t in waits],
                               timeout=self.settings.provider_probe_timeout_s + 0.5)
        out: list[dict[str, Any]] = []
        for p in self._active():
            state = self.state[p.id]
            out.extend({"id": f"{p.id}:{m}", "owned_by": p.id, "created": state.listed_at} for m in state.models)
        return out
