"""The inference server's errors: every failure of the OpenAI routes answers OpenAI's envelope.

``{"error": {"message", "type", "param", "code"}}`` with all four keys present
(:func:`conch.web.common.errors.openai_error_body`), so an OpenAI client raises the right
exception class. Routes raise :class:`~conch.inference.serving.errors.ServingError`, like the
serving layer under them (which maps the domain's exceptions in one table); request
validation is a ``400`` naming the field (never FastAPI's ``422``), unknown routes and HTTP
errors keep their status, and anything unexpected is a ``500`` naming the exception.

The other vendors' routes (Anthropic ``/v1/messages``, Ollama ``/api/*``) answer in their own
shapes and catch their errors themselves (``compat.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from conch.inference.serving.errors import ServingError
from conch.web.common.errors import openai_error, openai_error_body

log = logging.getLogger(__name__)

# The codes of the HTTP errors Starlette raises itself.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def error_response(err: ServingError) -> Response:
    body = openai_error_body(err.status, err.message, type=err.type, param=err.param, code=err.code)
    return Response(body, err.status, headers=err.headers, media_type="application/json")


def error_event(err: ServingError) -> dict[str, Any]:
    """The envelope as the last event of a stream whose ``200`` is already sent."""
    return openai_error(err.status, err.message, type=err.type, param=err.param, code=err.code)


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``"messages[0].role"``; union branch tags dropped."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    # A discriminated union names its branch by the tag value, which can equal the field below
    # it (response_format -> "json_schema" branch -> json_schema field): say it once.
    parts = [p for i, p in enumerate(parts) if i == 0 or p != parts[i - 1]]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
            continue
        text = str(p)
        # Pydantic names union branches by type ("str", "list[TextContentPart]", "function-after[...]").
        if any(ch in text for ch in "[]()-,") or text in ("str", "int", "float", "bool", "list", "dict", "none"):
            break
        out += ("." if out else "") + text
    return out or None


def validation_error(exc: RequestValidationError) -> ServingError:
    errors = exc.errors()
    if not errors:
        return ServingError(400, "Invalid request body", code="invalid_request_error")
    first = errors[0]
    etype = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if etype == "json_invalid":
        return ServingError(400, "The request body is not valid JSON", code="invalid_json")
    if etype == "missing" and loc == ("body",):
        return ServingError(400, "A JSON request body is required", code="invalid_request_error")
    param = _param_from_loc(loc)
    msg = first.get("msg", "invalid value")
    if etype == "missing":
        text = f"Missing required parameter: '{param}'"
    elif param:
        text = f"Invalid value for '{param}': {msg}"
    else:
        text = f"Invalid request body: {msg}"
    code = "missing_required_parameter" if etype == "missing" else "invalid_request_error"
    return ServingError(400, text, param=param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServingError)
    async def serving_error(request: Request, exc: ServingError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "Unknown route"
        headers = dict(exc.headers) if exc.headers else None
        code = _HTTP_CODES.get(exc.status_code)
        return error_response(ServingError(exc.status_code, message, code=code, headers=headers))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in the inference server")
        message = f"Internal server error: {type(exc).__name__}: {exc}"
        return error_response(ServingError(500, message, code="internal_error"))
