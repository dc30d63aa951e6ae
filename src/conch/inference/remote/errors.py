"""What can go wrong talking to a provider, as HTTP-shaped errors the routes pass on as they are.

Every message starts with the provider's id, so a client that talks to several providers
through conch knows which one failed. Keys never appear in messages: errors are built from
the provider's status and its own error text, never from request headers.
"""

from __future__ import annotations

from typing import Any

from conch.errors import DomainError


class ProviderError(DomainError, status=502, code="provider_error"):
    """A failure of (or refusal by) a provider: ``status`` is the HTTP status conch answers;
    ``code`` defaults to the class's; ``param`` (also ``where``) names the request field at fault."""

    code: str

    def __init__(self, provider: str, message: str, *, status: int | None = None,
                 code: str | None = None, param: str | None = None) -> None:
        text = message if message.startswith(f"{provider}: ") else f"{provider}: {message}"
        super().__init__(text, status=status, code=code or None, where=param)
        self.provider = provider
        self.param = param


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


def status_error(provider: str, status: int, body: Any, fallback: str) -> ProviderError:
    """The provider's error status and message, in conch's terms: its 4xx passed on (bad
    key, unknown model), its 5xx as 502 (503 stays 503: overloaded, try later)."""
    detail = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(detail, dict):
        message = str(detail.get("message") or fallback)
        code = detail.get("code") or detail.get("type")
        param = detail.get("param")
    else:
        message = str(detail or fallback)
        code = param = None
    if 400 <= status < 500:
        return ProviderRejected(provider, message, status=status,
                                code=str(code) if code else None,
                                param=str(param) if param else None)
    if status == 503:
        return ProviderUnavailable(provider, f"unavailable (503): {message}")
    return ProviderUnreachable(provider, f"failed with status {status}: {message}")


class UnknownProvider(LookupError):
    def __init__(self, provider: str, known: list[str]) -> None:
        super().__init__(f"Unknown provider '{provider}'; known: {', '.join(known)}")
        self.provider = provider
        self.known = known
