"""What every serving class holds: the local models, how model strings resolve, the counters,
and the providers that remote model strings (``"<provider>:<model>"``) go to.

Errors need no translation here: everything below raises errors of conch's one tree
(:mod:`conch.errors`) that carry their status, code and request field. The one thing only
the API knows is which field holds its prompt, so a prompt over the model's context is
blamed on it when the engine is leased (:meth:`Serving.lease`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from conch.inference.engines.base import ContextLengthExceeded, Engine
from conch.inference.models.store import ModelRecord
from conch.inference.remote.base import Provider
from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.manager import ModelManager
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver


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
