"""The composition root: the inference domain's objects, built once from the settings.

The inference server (``conch.web.inference.app``) and a process that serves its own models
without one (the shell's ``ai`` and ``embed``, :mod:`conch.inference.client`) build the same
:class:`ServingStack`: the model store and the loaded-model manager, the providers, one
resolver of model strings and the serving classes over them. Nothing else wires them.
"""

from __future__ import annotations

import asyncio

from conch.config import Settings
from conch.inference.models.acquire import Acquirer
from conch.inference.models.bundled import ensure_bundled_model
from conch.inference.models.store import ModelStore
from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.completions import CompletionServing
from conch.inference.serving.embeddings import EmbeddingServing
from conch.inference.serving.manager import ModelManager
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver


class ServingStack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = ModelStore(settings)
        self.manager = ModelManager(settings, self.store)
        self.providers = ProviderRegistry(settings, local_models=self.ready_ids)
        self.metrics = ServingMetrics()
        resolver = ModelResolver(self.manager, providers=list(self.providers.providers))
        self.chat = ChatServing(self.manager, resolver, self.metrics, providers=self.providers)
        self.embeddings = EmbeddingServing(self.manager, resolver, self.metrics, providers=self.providers)
        self.completions = CompletionServing(self.manager, resolver, self.metrics)
        self.acquirer = Acquirer(settings, self.store)  # downloads and conversions into the store

    async def start(self) -> None:
        """The data directories, and the bundled model registered (a file check once it is)."""
        self.settings.ensure_dirs()
        await asyncio.to_thread(ensure_bundled_model, self.store)
        # The memory budget's default is a share of the memory free now, before any model loads.
        await asyncio.to_thread(lambda: self.manager.budget)

    async def close(self) -> None:
        await self.providers.close()
        await self.manager.unload_all()

    async def ready_ids(self) -> list[str]:
        """The local models that can serve now (what validating the ``local`` provider lists)."""
        records = await asyncio.to_thread(self.store.list)
        return [r.id for r in records if r.status == "ready"]
