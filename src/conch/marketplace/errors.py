"""The marketplace's errors: a kind (what a client branches on), a message, the field at fault."""

from __future__ import annotations


class MarketplaceError(Exception):
    """``kind`` is one of :data:`KINDS`; the web layer maps it to a status code."""

    def __init__(self, kind: str, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field


# kind -> HTTP status, for the routes (kept here so every caller agrees on the meaning)
KINDS = {
    "RequestError": 400,  # malformed or unacceptable input; ``field`` names it
    "NotFoundError": 404,  # unknown agent, no matching version, not installed
    "ConflictError": 409,  # version already published, agent busy
    "IntegrityError": 409,  # a record whose digest does not match its manifest
    "UpstreamError": 502,  # the agent is only upstream, and the upstream did not answer
}


def invalid(message: str, field: str) -> MarketplaceError:
    return MarketplaceError("RequestError", message, field=field)


def not_found(message: str, field: str | None = None) -> MarketplaceError:
    return MarketplaceError("NotFoundError", message, field=field)


def conflict(message: str, field: str | None = None) -> MarketplaceError:
    return MarketplaceError("ConflictError", message, field=field)
