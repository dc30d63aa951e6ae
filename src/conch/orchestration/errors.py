"""Errors of the orchestration domain, on conch's one tree (:mod:`conch.errors`)."""

from __future__ import annotations

from conch import errors


class OrchestrationError(errors.DomainError, kind="OrchestrationError"):
    """The family's root: an orchestration failure no narrower class names (a 500)."""


class Invalid(OrchestrationError, errors.Invalid, kind="RequestError"):
    pass


class NotFound(OrchestrationError, errors.NotFound, kind="NotFound"):
    pass


class Conflict(OrchestrationError, errors.Conflict, kind="Conflict"):
    pass
