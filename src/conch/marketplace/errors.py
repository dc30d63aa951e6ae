"""The marketplace's errors, on conch's one tree (:mod:`conch.errors`).

The marketplace's clients know its kinds (``RequestError``, ``NotFoundError``, ...) and read the
field at fault as ``error.field``, so the family keeps both names.
"""

from __future__ import annotations

from conch import errors


class MarketplaceError(errors.DomainError, kind="MarketplaceError"):
    """The family's root; ``field`` (also ``where``) names the request field at fault."""

    where_key = "field"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, where=field)

    @property
    def field(self) -> str | None:
        return self.where


class RequestError(MarketplaceError, errors.Invalid, kind="RequestError"):
    """Malformed or unacceptable input; ``field`` names it."""


class NotFoundError(MarketplaceError, errors.NotFound, kind="NotFoundError"):
    """An unknown agent, no matching version, not installed."""


class ConflictError(MarketplaceError, errors.Conflict, kind="ConflictError"):
    """A version already published, an agent busy."""


class IntegrityError(MarketplaceError, errors.Conflict, kind="IntegrityError"):
    """A record whose digest does not match its manifest."""


class UpstreamError(MarketplaceError, errors.Upstream, kind="UpstreamError"):
    """The agent is only upstream, and the upstream did not answer."""


def invalid(message: str, field: str) -> MarketplaceError:
    return RequestError(message, field=field)


def not_found(message: str, field: str | None = None) -> MarketplaceError:
    return NotFoundError(message, field=field)


def conflict(message: str, field: str | None = None) -> MarketplaceError:
    return ConflictError(message, field=field)
