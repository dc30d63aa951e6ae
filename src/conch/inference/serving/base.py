"""What every serving class holds: the local models, how model strings resolve, the counters,
and the providers that remote model strings (``"<provider>:<model>"``) go to.

Errors need no translation here: everything below raises errors of conch's one tree
(:mod:`conch.errors`) that carry their status, code and request field. The one thing only
the API knows is which field holds its prompt, so a prompt over the model's context is
blamed on it when the engine is leased (:meth:`Serving.lease`).

Metering. A request may come with a :class:`Meter` (the caller's budget: the web layer's, for
the API key's token limits). The serving layer tokenizes the prompt anyway, so it tells the
meter the most the request can use (prompt tokens and the tokens it may generate) after
tokenizing and before generating, and what it used when it ends, however it ends (a client
gone included). A remote provider's prompt is estimated (:func:`estimate_tokens`) and its
use settled from the provider's ``usage``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Protocol

from conch.inference.engines.base import ContextLengthExceeded, Engine, Generation
from conch.inference.models.store import ModelRecord
from conch.inference.remote.base import Provider
from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.manager import ModelManager
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver

# The tokens a remote request without max_tokens is reserved for (per choice): its provider's
# limit is not known here; what it really used is settled from its usage.
REMOTE_MAX_TOKENS = 4096


class Meter(Protocol):
    """A request's token budget, told what the request may use before it generates and what
    it used at the end. :meth:`reserve` raises (a ``429`` of conch's error tree) to refuse
    the request; :meth:`settle` is called once, and is a no-op without a reservation."""

    async def reserve(self, model: str, prompt_tokens: int, max_new_tokens: int) -> None: ...

    async def settle(self, used_tokens: int) -> None: ...


class Bill:
    """A local request's metering: the prompt's tokens and the most it may generate reserved
    before generation starts, what it generated settled at the end (its generations' own
    count, which a request cut short has too). Set ``started`` once its generations are in
    ``gens``; settling before that bills nothing."""

    def __init__(self, meter: Meter | None) -> None:
        self.meter = meter
        self.prompt = 0
        self.gens: list[Generation] = []
        self.started = False

    async def reserve(self, model: str, prompt: int, most: int) -> None:
        self.prompt = prompt
        if self.meter is not None:
            await self.meter.reserve(model, prompt, most)

    async def settle(self, finished_tokens: int) -> None:
        if self.meter is None:
            return
        # A generation cut short may have sampled one more token than it reports.
        sampled = sum(g.generated + (0 if g.finished else 1) for g in self.gens)
        used = self.prompt + max(finished_tokens, sampled) if self.started else 0
        meter, self.meter = self.meter, None  # settled once
        await meter.settle(used)


def estimate_tokens(value: Any) -> int:
    """A remote request's prompt, estimated from above in tokens (a token is at least a
    character or two of text in every tokenizer conch knows; one per 2 characters, plus a
    little per message for the chat template)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text) // 2 + 16


def usage_tokens(obj: Any) -> int | None:
    """``usage.total_tokens`` (or prompt + completion) of an OpenAI object, when it has one."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) if any(isinstance(p, int) for p in parts) else None


class Serving:
    # The request field that holds the prompt (chat's ``messages``, ``input``, ``prompt``).
    prompt_field: ClassVar[str] = "messages"

    def __init__(self, manager: ModelManager, resolver: ModelResolver, metrics: ServingMetrics | None = None,
                 providers: ProviderRegistry | None = None) -> None:
        self.manager = manager
        self.resolver = resolver
        self.metrics = metrics or ServingMetrics()
        self.providers = providers  # None: no remote models (the legacy completions have none)

    def remote(self, model: str | None) -> tuple[Provider, str] | None:
        """The provider and its model name for a remote model string; ``None`` for a local one
        (raises the provider's error when it is configured but cannot serve)."""
        if self.providers is None or not model:
            return None
        return self.providers.route(model)

    @contextlib.asynccontextmanager
    async def lease(self, record: ModelRecord, keep_alive: float | str | None) -> AsyncIterator[Engine]:
        """``record``'s engine, loaded and held for the block."""
        try:
            async with self.manager.use(record.id, keep_alive) as engine:
                yield engine
        except ContextLengthExceeded as exc:
            exc.blame(self.prompt_field)
            raise


def request_body(req: Any) -> dict[str, Any]:
    """An OpenAI request as the client sent it (set fields only, wire names): what a provider
    is handed."""
    body: dict[str, Any] = req.model_dump(exclude_unset=True, exclude_none=True, by_alias=True)
    return body
