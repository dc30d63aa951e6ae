"""The errors every model source and the acquisition layer raise, on conch's one tree
(:mod:`conch.errors`): each names its status through the shared base it sits on, so the
routes answer with it and the domain code never imports the web layer.
"""

from __future__ import annotations

from conch import errors


class ModelOpError(errors.DomainError, code="internal_error"):
    """The family's root: a download or conversion failed in a way no narrower class names (500)."""

    code: str


class BadRequest(ModelOpError, errors.Invalid, code="invalid_request"):
    pass


class NotFound(ModelOpError, errors.NotFound, code="not_found"):
    pass


class Conflict(ModelOpError, errors.Conflict, code="conflict"):
    pass


class SourceUnreachable(ModelOpError, errors.Upstream, code="bad_gateway"):
    """The source could not be reached or answered with an error (the cause is in the message)."""


class VerificationFailed(ModelOpError, errors.Upstream, code="verification_failed"):
    """Bytes arrived but do not match the digest they were promised to have."""
