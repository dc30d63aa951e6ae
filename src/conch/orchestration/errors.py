"""Errors of the orchestration domain; the web layer maps ``status`` to the HTTP status."""

from __future__ import annotations


class OrchestrationError(Exception):
    status = 500
    kind = "OrchestrationError"

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where


class Invalid(OrchestrationError):
    status = 400
    kind = "RequestError"


class NotFound(OrchestrationError):
    status = 404
    kind = "NotFound"


class Conflict(OrchestrationError):
    status = 409
    kind = "Conflict"
