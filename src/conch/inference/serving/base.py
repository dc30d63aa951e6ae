"""What every serving class holds: the local models, how model strings resolve, the counters,
and the providers that remote model strings (``"<provider>:<model>"``) go to."""

from __future__ import annotations

from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.manager import ModelManager
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver


class Serving:
    def __init__(self, manager: ModelManager, resolver: ModelResolver, metrics: ServingMetrics | None = None,
                 providers: ProviderRegistry | None = None) -> None:
        self.manager = manager
        self.resolver = resolver
        self.metrics = metrics or ServingMetrics()
        self.providers = providers  # None: no remote models (the legacy completions have none)
