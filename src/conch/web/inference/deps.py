"""How a router reaches the inference server's domain objects.

``app.create_app`` builds every domain object once from the settings and puts it on
``app.state`` under a fixed name. A route never reads ``app.state`` itself (nor builds a domain
object): it declares a parameter typed with one of the ``Annotated`` aliases below, and FastAPI
hands it the object, so every router can be mounted on any app ``create_app`` built::

    @router.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, serving: EmbeddingDep) -> ...: ...
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from conch.config import Settings
from conch.inference.models.acquire import Acquirer
from conch.inference.models.store import ModelStore
from conch.inference.remote.registry import ProviderRegistry
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.completions import CompletionServing
from conch.inference.serving.embeddings import EmbeddingServing
from conch.inference.serving.manager import ModelManager
from conch.web.common.deps import state_getter
from conch.web.common.history import StatusHistory
from conch.web.inference.metrics import InferenceMetrics

SettingsDep = Annotated[Settings, Depends(state_getter("settings", Settings))]
StoreDep = Annotated[ModelStore, Depends(state_getter("store", ModelStore))]
ManagerDep = Annotated[ModelManager, Depends(state_getter("manager", ModelManager))]
AcquirerDep = Annotated[Acquirer, Depends(state_getter("acquirer", Acquirer))]
ProvidersDep = Annotated[ProviderRegistry, Depends(state_getter("providers", ProviderRegistry))]
MetricsDep = Annotated[InferenceMetrics, Depends(state_getter("metrics", InferenceMetrics))]
HistoryDep = Annotated[StatusHistory, Depends(state_getter("history", StatusHistory))]
ChatDep = Annotated[ChatServing, Depends(state_getter("chat", ChatServing))]
CompletionDep = Annotated[CompletionServing, Depends(state_getter("completions", CompletionServing))]
EmbeddingDep = Annotated[EmbeddingServing, Depends(state_getter("embeddings", EmbeddingServing))]
