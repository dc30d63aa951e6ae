"""How a conch server reports a failure: one exception for routes, one body builder per family.

conch serves two families of clients, and each expects its own error envelope:

    family      server                     body
    agent       agent/code-execution       {"success": false, "error": {"kind", "message", ...}}
    openai      inference (OpenAI API)     {"error": {"message", "type", "param", "code"}}

A route raises :class:`WebError` (status, message and the envelope's extra fields); the
server's exception handler turns it into a body with its family's builder. Middleware that
answers before any route (the security guard) is given the builder, so a refusal reads the
same as any other error of that server. The builders return ``bytes`` so that pure ASGI code
can send them without a response class.

Which status maps to what (the table both families' handlers use):

    status  agent kind        openai type
    400     RequestError      invalid_request_error
    401     RequestError      authentication_error
    403     RequestError      permission_error
    404     RequestError      invalid_request_error   (an unknown builtin: NameError)
    405     RequestError      invalid_request_error
    409     RequestError      conflict_error
    413     RequestError      invalid_request_error
    429     RequestError      rate_limit_error
    500     InternalError     server_error
    501     RequestError      not_implemented_error
    502/503 RequestError      provider_error
"""

from __future__ import annotations

from typing import Any, Protocol

from conch.errors import OPENAI_ERROR_TYPES
from conch.web.common.responses import compact_json

OPENAI_TYPES = OPENAI_ERROR_TYPES

AGENT_KINDS: dict[int, str] = {500: "InternalError"}


class ErrorBody(Protocol):
    """A family's body builder: ``(status, message, **fields) -> JSON bytes``."""

    def __call__(self, status: int, message: str, /, **fields: Any) -> bytes: ...


class WebError(Exception):
    """A failure a route reports to its client. ``fields`` are the family's extra envelope
    keys: ``kind``/``hint``/... for the agent server, ``type``/``param``/``code`` for the
    OpenAI one. ``headers`` go on the response (``WWW-Authenticate``, ``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.fields = fields


def _dumps(data: Any) -> bytes:
    return compact_json(data).encode()


def agent_error_body(status: int, message: str, /, kind: str | None = None, **extra: Any) -> bytes:
    """``{"success": false, "error": {"kind", "message", ...extra}}``."""
    error = {"kind": kind or AGENT_KINDS.get(status, "RequestError"), "message": message, **extra}
    return _dumps({"success": False, "error": error})


def openai_error(
    status: int,
    message: str,
    /,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` with all four keys present, so an
    OpenAI client raises the exception class that matches the status. A dict, for the error
    event that ends a stream; :func:`openai_error_body` is the same as a response body."""
    error_type = type or OPENAI_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def openai_error_body(status: int, message: str, /, **fields: Any) -> bytes:
    """:func:`openai_error` as JSON bytes (``fields``: ``type``, ``param``, ``code``)."""
    return _dumps(openai_error(status, message, **fields))
