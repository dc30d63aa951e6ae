"""The inference server's errors: one handler renders any error of conch's tree
(:class:`conch.errors.DomainError`) in the envelope of the API whose route raised it.

Each API the server speaks has one :class:`Envelope`: OpenAI's ``{"error": {"message", "type",
"param", "code"}}`` with all four keys present (so an OpenAI client raises the exception class
that matches the status), Anthropic's ``{"type": "error", "error": {"type", "message"}}``,
Ollama's ``{"error": "..."}``, and the Responses API's (OpenAI's, with its own ``type`` and its
own request fields' names). A router of another vendor's API declares its envelope through
its route class (:class:`AnthropicRoute`, :class:`OllamaRoute`, :class:`ResponsesRoute`);
every other route answers in OpenAI's. A stream whose ``200`` is already sent ends with the
same envelope as its last event (:meth:`Envelope.body`).

Request validation is a ``400`` naming the field (never FastAPI's ``422``), unknown routes and
HTTP errors keep their status, and anything unexpected is a ``500`` naming the exception: these
three answer in OpenAI's envelope on every route.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from conch.errors import DomainError
from conch.inference.api import anthropic, ollama, responses
from conch.inference.serving.errors import InvalidRequest
from conch.web.common.errors import openai_error, openai_error_body
from conch.web.common.responses import json_response

log = logging.getLogger(__name__)

# The codes of the HTTP errors Starlette raises itself.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class Envelope:
    """How one API writes an error: its body, as a response or as a stream's last event."""

    def field(self, where: str | None) -> str | None:
        """The API's name for a field of the chat request it was translated to."""
        return where

    def body(self, exc: DomainError) -> dict[str, Any]:
        raise NotImplementedError

    def response(self, exc: DomainError) -> Response:
        return json_response(self.body(exc), exc.status, exc.headers)


class OpenAIEnvelope(Envelope):
    def body(self, exc: DomainError) -> dict[str, Any]:
        return openai_error(exc.status, exc.message, type=exc.openai_type, param=exc.where, code=exc.code)

    def response(self, exc: DomainError) -> Response:
        body = openai_error_body(exc.status, exc.message, type=exc.openai_type, param=exc.where, code=exc.code)
        return Response(body, exc.status, headers=exc.headers, media_type="application/json")


class AnthropicEnvelope(Envelope):
    def body(self, exc: DomainError) -> dict[str, Any]:
        return anthropic.error_body(exc.status, exc.message)


class OllamaEnvelope(Envelope):
    def body(self, exc: DomainError) -> dict[str, Any]:
        return ollama.error_body(exc.message)


class ResponsesEnvelope(Envelope):
    def field(self, where: str | None) -> str | None:
        return responses.chat_param(where)

    def body(self, exc: DomainError) -> dict[str, Any]:
        return responses.error_body(exc.status, exc.message, self.field(exc.where), exc.code)


OPENAI = OpenAIEnvelope()
ANTHROPIC = AnthropicEnvelope()
OLLAMA = OllamaEnvelope()
RESPONSES = ResponsesEnvelope()


class EnvelopeRoute(APIRoute):
    """A route whose errors answer in ``envelope``; a router of another API sets its own."""

    envelope: ClassVar[Envelope] = OPENAI


class AnthropicRoute(EnvelopeRoute):
    envelope = ANTHROPIC


class OllamaRoute(EnvelopeRoute):
    envelope = OLLAMA


class ResponsesRoute(EnvelopeRoute):
    envelope = RESPONSES


def envelope_of(request: Request) -> Envelope:
    route = request.scope.get("route")
    return route.envelope if isinstance(route, EnvelopeRoute) else OPENAI


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


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    errors = exc.errors()
    if not errors:
        return InvalidRequest("Invalid request body")
    first = errors[0]
    etype = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if etype == "json_invalid":
        return InvalidRequest("The request body is not valid JSON", code="invalid_json")
    if etype == "missing" and loc == ("body",):
        return InvalidRequest("A JSON request body is required")
    param = _param_from_loc(loc)
    msg = first.get("msg", "invalid value")
    if etype == "missing":
        text = f"Missing required parameter: '{param}'"
    elif param:
        text = f"Invalid value for '{param}': {msg}"
    else:
        text = f"Invalid request body: {msg}"
    code = "missing_required_parameter" if etype == "missing" else "invalid_request_error"
    return InvalidRequest(text, where=param, code=code)


def _openai_response(status: int, message: str, code: str | None, headers: dict[str, str] | None = None) -> Response:
    return Response(openai_error_body(status, message, code=code), status, headers=headers,
                    media_type="application/json")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain_error(request: Request, exc: DomainError) -> Response:
        return envelope_of(request).response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return OPENAI.response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "Unknown route"
        headers = dict(exc.headers) if exc.headers else None
        return _openai_response(exc.status_code, message, _HTTP_CODES.get(exc.status_code), headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in the inference server")
        return _openai_response(500, f"Internal server error: {type(exc).__name__}: {exc}", "internal_error")
