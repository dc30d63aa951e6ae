"""What can go wrong talking to a provider, as HTTP-shaped errors the routes pass on as they are.

Every message starts with the provider's id, so a client that talks to several providers
through conch knows which one failed. Keys never appear in messages: errors are built from
the provider's status and its own error text, never from request headers.
"""

from __future__ import annotations

from conch.errors import DomainError


class ProviderError(DomainError, status=502, code="provider_error"):
    """A failure of (or refusal by) a provider: ``status`` is the HTTP status conch answers;
    ``code`` defaults to the class's; ``param`` (also ``where``) names the request field at fault."""

    code: str

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
        super().__init__(text, status=status, code=code or None, where=param)
        self.provider = provider
        self.param = param
        self.type = type


class ProviderUnreachable(ProviderError, status=502, code="provider_unreachable"):
    """The provider could not be reached or answered garbage (502)."""


class ProviderUnavailable(ProviderError, status=503, code="provider_unavailable"):
    """The provider is known but cannot serve now: no key configured, disabled, overloaded (503)."""


class ProviderTimeout(ProviderError, status=504, code="provider_timeout"):
    """The provider went silent for longer than ``provider_timeout_s`` (504)."""


class ProviderRejected(ProviderError, code="provider_rejected"):
    """The provider's own 4xx (bad key, unknown model, invalid field), passed on with its status."""


class UnsupportedByProvider(ProviderError, status=400, code="unsupported_by_provider"):
    """A request field the provider has no equivalent for: a 400 naming provider and field,
    never a silent drop."""

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
