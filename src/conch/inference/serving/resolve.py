"""Which model a request's ``model`` string names, checked before any engine loads."""

from __future__ import annotations

from collections.abc import Collection

from conch.inference.manager import ModelManager
from conch.inference.providers.kinds import remote_prefix
from conch.inference.serving.errors import InvalidRequest, NotAvailable, domain_errors
from conch.inference.store import ModelRecord


class ModelResolver:
    def __init__(self, manager: ModelManager, providers: Collection[str] = ()) -> None:
        self.manager = manager
        self.providers = tuple(providers)

    def local_record(self, model: str, capability: str) -> ModelRecord:
        """The ready local model ``model`` names, able to serve ``capability``."""
        provider = remote_prefix(model, self.providers)
        if provider is not None:
            raise NotAvailable(
                f"Remote provider '{provider}' is not available in this version of conch; "
                "only local models can be used",
                code="provider_not_implemented",
                param="model",
            )
        with domain_errors("model"):
            record = self.manager.record_for(model)
        if capability not in record.capabilities:
            raise InvalidRequest(
                f"The model '{model}' does not support {capability}", code="unsupported_model", param="model"
            )
        return record
