"""The errors every model source and the acquisition layer raise, each carrying its HTTP status.

The status is what the routes answer with, so the web layer stays thin and the domain code
never imports it.
"""

from __future__ import annotations

from conch.errors import DomainError


class ModelOpError(DomainError, status=500, code="internal_error"):
    """A failure of a download or conversion, with the HTTP status that describes it."""

    code: str

    @property
    def status_code(self) -> int:
        return self.status


class BadRequest(ModelOpError, status=400, code="invalid_request"):
    pass


class NotFound(ModelOpError, status=404, code="not_found"):
    pass


class Conflict(ModelOpError, status=409, code="conflict"):
    pass


class SourceUnreachable(ModelOpError, status=502, code="bad_gateway"):
    """The source could not be reached or answered with an error (the cause is in the message)."""


class VerificationFailed(ModelOpError, status=502, code="verification_failed"):
    """Bytes arrived but do not match the digest they were promised to have."""
