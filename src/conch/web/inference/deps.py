"""FastAPI dependencies: the domain objects ``create_app`` put on ``app.state``.

A route names what it needs (``chat: ChatServing = Depends(chat_serving)``) and never builds
domain objects itself, so every router can be mounted on any app built by ``create_app``.
"""

from __future__ import annotations

from conch.config import Settings
from conch.inference.acquire import Acquirer
from conch.inference.manager import ModelManager
from conch.inference.providers.registry import ProviderRegistry
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.embeddings import EmbeddingServing
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.store import ModelStore
from conch.web.common.deps import state_getter

settings = state_getter("settings", Settings)
store = state_getter("store", ModelStore)
manager = state_getter("manager", ModelManager)
acquirer = state_getter("acquirer", Acquirer)
chat_serving = state_getter("chat", ChatServing)
embedding_serving = state_getter("embeddings", EmbeddingServing)
serving_metrics = state_getter("serving_metrics", ServingMetrics)
providers = state_getter("providers", ProviderRegistry)
