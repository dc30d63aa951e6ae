"""What can go wrong talking to a provider, on conch's one tree (:mod:`conch.errors`): the
routes pass these on as they are.

Every message starts with the provider's id, so a client that talks to several providers
through conch knows which one failed. Keys never appear in messages: errors are built from
the provider's status and its own error text, never from request headers.
"""

from __future__ import annotations

from typing import Any

from conch import errors


class ProviderError(errors.DomainError, code="provider_error"):
    """The family's root: a failure of (or refusal by) a provider. ``where`` (``param``, as the
    OpenAI envelope names it) is the request field at fault."""

    code: str

    def __init__(self, provider: str, message: str, *, status: int | None = None,
                 code: str | None = None, where: str | None = None) -> None:
        text = message if message.startswith(f"{provider}: ") else f"{provider}: {message}"
        super().__init__(text, status=status, code=code or None, where=where)
        self.provider = provider

    @property
    def param(self) -> str | None:
        return self.where

    @property
    def openai_type(self) -> str:
        # The provider failed, or went silent (504): OpenAI's clients read either as its error.
        return "provider_error" if self.status >= 500 else super().openai_type


class ProviderUnreachable(ProviderError, errors.Upstream, code="provider_unreachable"):
    """The provider could not be reached or answered garbage (502)."""


class ProviderUnavailable(ProviderError, errors.Unavailable, code="provider_unavailable"):
    """The provider is known but cannot serve now: no key configured, disabled, overloaded (503)."""


class ProviderTimeout(ProviderError, errors.Timeout, code="provider_timeout"):
    """The provider went silent for longer than ``provider_timeout_s`` (504)."""


class ProviderRejected(ProviderError, errors.Invalid, code="provider_rejected"):
    """The provider's own 4xx (bad key, unknown model, invalid field), passed on with its status."""


class UnsupportedByProvider(ProviderError, errors.Invalid, code="unsupported_by_provider"):
    """A request field the provider has no equivalent for: a 400 naming provider and field,
    never a silent drop."""

    def __init__(self, provider: str, param: str, detail: str | None = None) -> None:
        message = f"'{param}' is not supported by provider '{provider}'"
        if detail:
            message += f": {detail}"
        super().__init__(provider, message, where=param)


class NoModelNamed(ProviderError, errors.Invalid, code="invalid_request_error"):
    """A model string that names a provider and no model (``ollama:``)."""

    def __init__(self, provider: str, model: str) -> None:
        super().__init__(provider, f"the model string '{model}' names no model after '{provider}:'", where="model")


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
                                where=str(param) if param else None)
    if status == 503:
        return ProviderUnavailable(provider, f"unavailable (503): {message}")
    return ProviderUnreachable(provider, f"failed with status {status}: {message}")


class UnknownProvider(errors.NotFound, code="provider_not_found"):
    """No provider of that id is configured (the id is the request's ``provider_id``)."""

    def __init__(self, provider: str, known: list[str]) -> None:
        super().__init__(f"Unknown provider '{provider}'; known: {', '.join(known)}", where="provider_id")
        self.provider = provider
        self.known = known
