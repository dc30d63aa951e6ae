"""What can go wrong talking to a provider, as HTTP-shaped errors the routes pass on as they are.

Every message starts with the provider's id, so a client that talks to several providers
through conch knows which one failed. Keys never appear in messages: errors are built from
the provider's status and its own error text, never from request headers.
"""

from __future__ import annotations


class ProviderError(Exception):
    """A failure of (or refusal by) a provider: ``status`` is the HTTP status conch answers."""

    status = 502
    default_code = "provider_error"

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
    ) -> None:
        text = message if message.startswith(f"{provider}: ") else f"{provider}: {message}"
        super().__init__(text)
        self.provider = provider
        self.message = text
        if status is not None:
            self.status = status
        self.code = code or self.default_code
        self.param = param
        self.type = type


class ProviderUnreachable(ProviderError):
    """The provider could not be reached or answered garbage (502)."""

    status = 502
    default_code = "provider_unreachable"


class ProviderUnavailable(ProviderError):
    """The provider is known but cannot serve now: no key configured, disabled, overloaded (503)."""

    status = 503
    default_code = "provider_unavailable"


class ProviderTimeout(ProviderError):
    """The provider went silent for longer than ``provider_timeout_s`` (504)."""

    status = 504
    default_code = "provider_timeout"


class ProviderRejected(ProviderError):
    """The provider's own 4xx (bad key, unknown model, invalid field), passed on with its status."""

    default_code = "provider_rejected"


class UnsupportedByProvider(ProviderError):
    """A request field the provider has no equivalent for: a 400 naming provider and field,
    never a silent drop."""

    status = 400
    default_code = "unsupported_by_provider"

    def __init__(self, provider: str, param: str, detail: str | None = None) -> None:
        message = f"'{param}' is not supported by provider '{provider}'"
        if detail:
            message += f": {detail}"
        super().__init__(provider, message, param=param)


class UnknownProvider(LookupError):
    def __init__(self, provider: str, known: list[str]) -> None:
        super().__init__(f"Unknown provider '{provider}'; known: {', '.join(known)}")
        self.provider = provider
        self.known = known
