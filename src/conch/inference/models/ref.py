"""Which model a model string names: ``"<provider>:<name>"``, ``local:<id>`` or a local id.

Model strings are split at their first colon when what comes before it names a provider: one
configured on this server, or a well-known remote kind (``ollama``, ``openai``, ``vllm``, ...),
so that an unconfigured one is reported as such instead of being looked up as a local id.
Anything else is a local model id, colons included: ``local:qwen2.5:7b`` and ``qwen2.5:7b``
name the same local model, and ``ollama:qwen2.5:7b`` is the model ``qwen2.5:7b`` at the
provider ``ollama``. Every place that reads a model string reads it through
:meth:`ModelRef.parse`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import get_args

# What ``[providers.NAME] kind = ...`` in conch.toml may say (ProviderConfig.kind). It is
# defined in conch.config so that reading the settings never imports conch.inference.
from conch.config import RemoteProviderKind

LOCAL = "local"
REMOTE_PROVIDER_KINDS: tuple[str, ...] = get_args(RemoteProviderKind)
# OpenAI-compatible servers by the names users give them in conch.toml: a model string may
# name one before it is configured, and is then told that it is not.
OPENAI_COMPATIBLE_SERVERS = ("vllm", "llamacpp", "lmstudio")


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A model string, read: ``provider`` is :data:`LOCAL` or a provider's id, ``name`` the
    model's id there (empty when the string ends at the colon)."""

    provider: str
    name: str

    @classmethod
    def parse(cls, model: str, providers: Collection[str] = ()) -> ModelRef:
        """``model`` read with ``providers`` (the ids configured here) as provider prefixes."""
        prefix, sep, rest = model.partition(":")
        if sep and (prefix == LOCAL or prefix in providers or prefix in REMOTE_PROVIDER_KINDS
                    or prefix in OPENAI_COMPATIBLE_SERVERS):
            return cls(prefix, rest)
        return cls(LOCAL, model)

    @property
    def is_local(self) -> bool:
        return self.provider == LOCAL

    @property
    def local_id(self) -> str | None:
        """The id in conch's model store, or None when the string names a remote model."""
        return self.name if self.provider == LOCAL else None
