"""The OpenAI error envelope for every failure of the inference server.

``{"error": {"message", "type", "param", "code"}}`` with all four keys present, for the
serving layer's errors (``ServingError``, mapped from the domain in one table there), for request validation (400, never FastAPI's 422 shape), for unknown routes and for
unexpected exceptions (500), so an OpenAI client raises the right exception class.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from conch.inference.serving.errors import ServingError

log = logging.getLogger(__name__)

class APIError(ServingError):
    """An error only the HTTP layer can know (a route's own checks); rendered like any ServingError."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message, type=type, param=param, code=code, headers=headers)


def error_response(err: ServingError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


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


def validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "Invalid request body", code="invalid_request_error")
    first = errors[0]
    etype = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if etype == "json_invalid":
        return APIError(400, "The request body is not valid JSON", code="invalid_json")
    if etype == "missing" and loc == ("body",):
        return APIError(400, "A JSON request body is required", code="invalid_request_error")
    param = _param_from_loc(loc)
    msg = first.get("msg", "invalid value")
    if etype == "missing":
        text = f"Missing required parameter: '{param}'"
    elif param:
        text = f"Invalid value for '{param}': {msg}"
    else:
        text = f"Invalid request body: {msg}"
    return APIError(400, text, param=param, code="invalid_request_error" if etype != "missing" else "missing_required_parameter")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServingError)
    async def _serving_error(_request: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "Unknown route"
        return error_response(
            APIError(exc.status_code, message, code=code, headers=getattr(exc, "headers", None))
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in the inference server")
        return error_response(APIError(500, f"Internal server error: {type(exc).__name__}: {exc}", code="internal_error"))
