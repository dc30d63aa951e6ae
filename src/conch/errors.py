"""conch's one error tree: every failure domain code reports to a client descends from here.

Domain code (``inference/``, ``orchestration/``, ``marketplace/``, ``sandbox/``) never imports
the web layer, yet its failures must reach a client with the right status and envelope. So
each error carries what any envelope needs, and nothing web-shaped:

    status   the HTTP status a route answers with
    kind     the agent server's ``error.kind`` (what a client of that envelope branches on)
    code     the OpenAI envelope's ``error.code`` (``None`` where there is none)
    message  the text shown to the client
    where    the request field (or place) at fault, ``None`` when it is the request as a whole
    headers  response headers the failure implies (``Retry-After`` on a 429)

The shared bases below (:class:`Invalid`, :class:`NotFound`, :class:`Conflict`, ...) name each
status once. A family (the marketplace's errors, the providers', ...) has a root of its own
that sets no status, and re-parents onto the base that says what went wrong; it may rename
the ``kind`` or ``code`` its clients already know::

    class MarketplaceError(DomainError): ...
    class NotFoundError(MarketplaceError, NotFound, kind="NotFoundError"): ...

A family's root must not set ``status``: the base that comes after it in the MRO decides.
The web layer has one handler per envelope (agent, OpenAI, Anthropic, Ollama), each rendering
any :class:`DomainError`; see ``conch.web.common.errors``.
"""

from __future__ import annotations

import math
from typing import ClassVar

# The OpenAI error envelope's ``type`` for each status, read by every OpenAI-shaped answer.
OPENAI_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_implemented_error",
    502: "provider_error",
    503: "provider_error",
}


class DomainError(Exception):
    """A failure of domain code, with what every envelope needs (see the module doc).

    A subclass names its status, kind and code in its header rather than in a body of
    attributes (``class Gone(DomainError, status=410, kind="Gone"): ...``); ``__init__``'s
    keywords override them for one instance."""

    status: int = 500
    kind: str = "InternalError"
    code: str | None = None
    # The OpenAI envelope's ``type``; ``None``: the one :data:`OPENAI_ERROR_TYPES` gives.
    type: str | None = None
    # The agent envelope's key for ``where`` (the marketplace's clients read ``field``).
    where_key: ClassVar[str] = "where"

    def __init_subclass__(
        cls,
        *,
        status: int | None = None,
        kind: str | None = None,
        code: str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if kind is not None:
            cls.kind = kind
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        status: int | None = None,
        kind: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.headers = headers
        if status is not None:
            self.status = status
        if kind is not None:
            self.kind = kind
        if code is not None:
            self.code = code

    @property
    def openai_type(self) -> str:
        return self.type or OPENAI_ERROR_TYPES.get(self.status, "invalid_request_error")


class Invalid(DomainError, status=400, kind="RequestError", code="invalid_request_error"):
    """The request is malformed or asks for something that cannot be (``where`` names it)."""


class Unauthorized(DomainError, status=401, kind="RequestError", code="invalid_api_key"):
    """No credentials, or credentials this server does not know."""


class Forbidden(DomainError, status=403, kind="RequestError", code="permission_denied"):
    """Known credentials that may not do this."""


class NotFound(DomainError, status=404, kind="NotFound", code="not_found"):
    """The thing named does not exist (or is not visible to the caller)."""


class Conflict(DomainError, status=409, kind="Conflict", code="conflict"):
    """The thing exists but is in a state that refuses the request."""


class TooLarge(DomainError, status=413, kind="LimitError", code="request_too_large"):
    """A body, upload or value over a size limit."""


class LimitExceeded(DomainError, status=429, kind="LimitError", code="rate_limit_exceeded"):
    """A rate, a budget or a queue is full; ``retry_after`` (seconds) goes out as ``Retry-After``."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_after = retry_after
        if retry_after is not None:
            # Rounded up: a client that waits exactly this long must find room.
            self.headers = {**(self.headers or {}), "Retry-After": str(max(1, math.ceil(retry_after)))}


class Internal(DomainError, status=500, kind="InternalError", code="internal_error"):
    """conch itself failed (a bug, or a resource it needs broke)."""


class NotImplementedHere(DomainError, status=501, kind="RequestError", code="not_implemented"):
    """Known, but this server cannot do it (a runtime or an extra is not installed)."""


class Upstream(DomainError, status=502, kind="UpstreamError", code="bad_gateway"):
    """A service conch depends on failed or answered garbage."""


class Unavailable(DomainError, status=503, kind="Unavailable", code="unavailable"):
    """Known and configured, but cannot serve now; try again later."""


class Timeout(DomainError, status=504, kind="Timeout", code="timeout"):
    """A service conch depends on went silent for too long."""
