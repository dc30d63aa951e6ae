"""One exception tree for everything the serving layer refuses, and one table from the domain.

A :class:`ServingError` carries what an OpenAI error envelope needs (status, message, type,
param, code, headers); the web layer renders it and nothing else. Domain exceptions become
serving errors through :data:`DOMAIN_ERRORS`, the single table saying which status, code and
request field each one means. An exception the table does not list is a bug and is left to
propagate (a 500 naming it), never reported as the client's fault.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from conch.errors import OPENAI_ERROR_TYPES, DomainError
from conch.inference.engines.base import (
    ChatInputError,
    ContextLengthExceeded,
    EngineError,
    QueueFull,
    RuntimeMissing,
    Unsupported,
)
from conch.inference.serving.manager import (
    InvalidKeepAlive,
    ModelLoadFailed,
    ModelNeedsConversion,
    ModelNotFound,
    ModelNotReady,
)

# Kept under its old name for the callers that read it from here.
ERROR_TYPES = OPENAI_ERROR_TYPES


class ServingError(DomainError):
    """What the serving layer refuses; ``param`` (also ``where``) names the request field."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, status=status, code=code, where=param)
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")
        self.param = param
        self.headers = headers


class InvalidRequest(ServingError):
    def __init__(self, message: str, *, param: str | None, code: str = "invalid_request_error") -> None:
        super().__init__(400, message, param=param, code=code)


class NotFound(ServingError):
    def __init__(self, message: str, *, param: str | None = None, code: str = "not_found") -> None:
        super().__init__(404, message, param=param, code=code)


class Conflict(ServingError):
    def __init__(self, message: str, *, param: str | None = None, code: str = "conflict") -> None:
        super().__init__(409, message, param=param, code=code)


class Overloaded(ServingError):
    def __init__(self, message: str) -> None:
        super().__init__(429, message, code="queue_full", headers={"Retry-After": "1"})


class NotAvailable(ServingError):
    """501: the server knows the request but cannot serve it here (a runtime, a provider)."""

    def __init__(self, message: str, *, param: str | None = None, code: str) -> None:
        super().__init__(501, message, param=param, code=code)


class InferenceFailed(ServingError):
    def __init__(self, message: str) -> None:
        super().__init__(500, message, code="inference_error")


# Placeholders for the param column: the exception's own field, or the request's prompt field
# (``messages`` for chat, ``input`` for embeddings).
OWN = "<own>"
PROMPT = "<prompt>"

# Most specific first: the first row whose class matches wins.
DOMAIN_ERRORS: tuple[tuple[type[BaseException], int, str, str | None], ...] = (
    (ModelNotFound, 404, "model_not_found", "model"),
    (ModelNeedsConversion, 400, "model_needs_conversion", "model"),
    (ModelNotReady, 409, "model_not_ready", "model"),
    (ModelLoadFailed, 500, "model_load_failed", "model"),
    (InvalidKeepAlive, 400, "invalid_request_error", "keep_alive"),
    (ChatInputError, 400, "invalid_request_error", OWN),
    (ContextLengthExceeded, 400, "context_length_exceeded", PROMPT),
    (QueueFull, 429, "queue_full", None),
    (Unsupported, 400, "unsupported_model", "model"),
    (RuntimeMissing, 501, "runtime_not_installed", "model"),
    (EngineError, 500, "inference_error", None),
)


def from_domain(exc: BaseException, prompt_param: str) -> ServingError | None:
    """The serving error a domain exception means, or None when the table does not list it."""
    if isinstance(exc, ServingError):
        return exc
    for cls, status, code, param in DOMAIN_ERRORS:
        if not isinstance(exc, cls):
            continue
        message = str(exc)
        if param == OWN:
            param = getattr(exc, "param", None)
        elif param == PROMPT:
            param = prompt_param
            if prompt_param != "messages":
                message = message.replace("the prompt", f"the {prompt_param}")
        if status == 500:
            message = f"Inference failed: {message}"
        headers = {"Retry-After": "1"} if status == 429 else None
        return ServingError(status, message, param=param, code=code, headers=headers)
    return None


@contextlib.contextmanager
def domain_errors(prompt_param: str) -> Iterator[None]:
    """Re-raise the domain exceptions of the block as serving errors (see :data:`DOMAIN_ERRORS`)."""
    try:
        yield
    except ServingError:
        raise
    except Exception as exc:
        err = from_domain(exc, prompt_param)
        if err is None:
            raise
        raise err from exc
