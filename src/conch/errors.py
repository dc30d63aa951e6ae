"""The root of conch's domain error tree, and the status table the OpenAI envelope uses.

Domain code (``inference/``, ``agents/``, ``marketplace/``, ``orchestration/``) never imports
the web layer, yet its failures must reach a client with the right HTTP status. So each
domain error carries what a route needs to answer and nothing web-shaped:

    status   the HTTP status a route answers with
    code     a short machine-readable name of the failure (``None`` where the family has none)
    message  the text shown to the client
    where    the request field (or place) at fault, ``None`` when it is the request as a whole

The families below :class:`DomainError`, each keeping its own public names:

    conch.inference.sources.errors.ModelOpError     downloads and conversions
    conch.inference.providers.errors.ProviderError  remote providers (``where`` is ``param``)
    conch.inference.serving.errors.ServingError     what the serving layer refuses

The web layer renders any of them with its family's body builder (``conch.web.common.errors``).
"""

from __future__ import annotations

# The OpenAI error envelope's ``type`` for each status (both the serving layer and the
# OpenAI-family body builder read it, so a status reads the same from either).
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
    """A failure of domain code, with the HTTP status that describes it (see the module doc).

    A subclass names its status and code in its header rather than in a body of attributes:
    ``class NotFound(ModelOpError, status=404, code="not_found"): ...``; ``__init__``'s
    ``status``/``code`` override them for one instance."""

    status: int = 500
    code: str | None = None

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None) -> None:
        super().__init_subclass__()
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        where: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.where = where
