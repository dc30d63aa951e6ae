"""The kinds of model provider conch knows, shared by the config and the model resolver.

``local`` is conch's own store and engines. The others are remote; ``openai_compatible``
covers any server speaking OpenAI's API (vLLM, llama.cpp's server, LM Studio, another conch),
and those well-known names are also accepted as a provider prefix on a model string
(``vllm:my-model``), as they are the names users give such providers in conch.toml.
"""

from __future__ import annotations

from typing import get_args

# What ``[providers.NAME] kind = ...`` in conch.toml may say (ProviderConfig.kind).
from conch.config import RemoteProviderKind

REMOTE_PROVIDER_KINDS: tuple[str, ...] = get_args(RemoteProviderKind)
PROVIDER_KINDS: tuple[str, ...] = ("local", *REMOTE_PROVIDER_KINDS)
OPENAI_COMPATIBLE_SERVERS = ("vllm", "llamacpp", "lmstudio")


def remote_prefix(model: str, configured: tuple[str, ...] | list[str] = ()) -> str | None:
    """The provider a ``provider:model`` string names, when that provider is remote."""
    if ":" not in model:
        return None
    prefix = model.split(":", 1)[0]
    if prefix in REMOTE_PROVIDER_KINDS or prefix in OPENAI_COMPATIBLE_SERVERS or prefix in configured:
        return prefix
    return None
