"""Which model a request's ``model`` string names, checked before any engine loads."""

from __future__ import annotations

from collections.abc import Collection

from conch.inference.models.ref import ModelRef
from conch.inference.models.store import ModelRecord
from conch.inference.serving.errors import InvalidRequest, NotFound
from conch.inference.serving.manager import ModelManager


class ModelResolver:
    def __init__(self, manager: ModelManager, providers: Collection[str] = ()) -> None:
        self.manager = manager
        self.providers = tuple(providers)

    def local_record(self, model: str, capability: str) -> ModelRecord:
        """The ready local model ``model`` names, able to serve ``capability``."""
        ref = ModelRef.parse(model, self.providers)
        if not ref.is_local:
            # Configured providers are answered before the local path: this one is not configured.
            raise NotFound(
                f"Provider '{ref.provider}' is not configured: add [providers.{ref.provider}] with its url "
                "to conch.toml (or use a local model id)",
                code="provider_not_found",
                where="model",
            )
        record = self.manager.record_for(model)
        if capability not in record.capabilities:
            raise InvalidRequest(
                f"The model '{model}' does not support {capability}", code="unsupported_model", where="model"
            )
        return record
