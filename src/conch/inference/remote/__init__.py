"""Remote model providers behind conch's OpenAI-compatible API (SPEC §3.3).

One module per kind (``ollama``, ``openai_compat`` for OpenAI and every OpenAI-compatible
endpoint, ``anthropic``), one registry (:mod:`.registry`) that routes model strings,
probes providers and caches their model lists. Domain code: no HTTP framework here.
"""

from conch.inference.remote.errors import (
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    ProviderUnreachable,
    UnknownProvider,
    UnsupportedByProvider,
)

__all__ = [
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "ProviderUnreachable",
    "UnknownProvider",
    "UnsupportedByProvider",
]
