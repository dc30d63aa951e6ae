"""The provider interface: one remote model service behind conch's OpenAI-shaped API.

Requests and answers are OpenAI chat/embeddings dicts (the wire shapes of
``/v1/chat/completions`` and ``/v1/embeddings``), so the serving layer hands a provider
the request it validated and sends back what the provider returns. Each kind translates
to and from its vendor's own protocol through the vendor's official client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from conch.inference.remote.errors import (
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    ProviderUnreachable,
    UnsupportedByProvider,
)

# Fields of conch's request models that are conch's own (or the route's) and never go upstream.
CONCH_ONLY_FIELDS = frozenset({"model", "stream", "keep_alive"})


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    read_s: float = 120.0  # longest silence before a 504
    probe_s: float = 2.0


class Provider(ABC):
    """A configured provider. ``id`` is the prefix of model strings (``ollama:qwen2.5:7b``)."""

    kind: str = ""
    # What the kind's HTTP transport raises on a timeout (httpx's, or the vendor client's fork's).
    transport_timeouts: tuple[type[BaseException], ...] = (httpx.TimeoutException,)

    def __init__(self, id: str, url: str | None, timeouts: Timeouts) -> None:
        self.id = id
        self.url = url.rstrip("/") if url else url
        self.timeouts = timeouts

    def configured(self) -> bool:
        """Whether it has what it needs to be tried at all (a key, for hosted APIs)."""
        return True

    def unavailable_reason(self) -> str:
        return f"provider '{self.id}' is not configured"

    @abstractmethod
    async def list_models(self, timeout: float | None = None) -> list[str]:
        """Model names (without the provider prefix): a real round trip."""

    @abstractmethod
    async def chat(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """A ``chat.completion`` dict for an OpenAI chat request ``body``."""

    @abstractmethod
    async def chat_stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Open a stream (errors up to the first answer are raised here, before any chunk)
        and return an iterator of ``chat.completion.chunk`` dicts. Closing the iterator
        (``aclose``) closes the upstream request."""

    async def embed(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        raise UnsupportedByProvider(self.id, "input", "this provider has no embeddings")

    async def aclose(self) -> None:
        return None

    # -- errors every kind reports alike ----------------------------------------------------
    def _require_configured(self) -> None:
        if not self.configured():
            raise ProviderUnavailable(self.id, self.unavailable_reason())

    def _timed_out(self, timeout: float | None = None) -> ProviderTimeout:
        """No answer within ``timeout`` (by default the configured read timeout)."""
        return ProviderTimeout(self.id, f"no answer within {timeout or self.timeouts.read_s:g} s")

    def _transport_error(self, exc: BaseException, timeout: float | None = None) -> ProviderError:
        """An HTTP transport error: the connection went silent, failed or broke off."""
        if isinstance(exc, self.transport_timeouts):
            return self._timed_out(timeout)
        return ProviderUnreachable(self.id, f"the connection to {self.url} failed ({type(exc).__name__})")
