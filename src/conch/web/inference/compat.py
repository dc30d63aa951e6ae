"""What the routers of the other vendors' APIs share: the JSON body read in the vendor's error
shape, stream plumbing, and :func:`serve_chat`, a vendor's chat API (Anthropic Messages,
OpenAI Responses) described by a :class:`ChatDialect` and served by the chat serving layer.

Each vendor API answers errors in its own shape (Anthropic ``{"type": "error", ...}``,
Ollama ``{"error": "..."}``, OpenAI's envelope), so these routers read their bodies
themselves instead of letting FastAPI's validation answer in OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from conch.inference.api.dialect import TranslationError
from conch.inference.api.openai import ChatCompletionRequest
from conch.inference.api.stream import ChatStreamTranslator
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.errors import from_domain
from conch.web.common.sse import EventStreamResponse

# Turns (status, message, param, code) into the vendor's error body.
ErrorShape = Callable[[int, str, str | None, str | None], dict[str, Any]]


class VendorError(Exception):
    """An error to answer in the calling API's own shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers
        self.code = code


def respond_error(exc: VendorError, shape: ErrorShape) -> JSONResponse:
    return JSONResponse(shape(exc.status, exc.message, exc.param, exc.code), status_code=exc.status,
                        headers=exc.headers)


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        raise VendorError(400, "A JSON request body is required")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise VendorError(400, "The request body is not valid JSON")
    if not isinstance(body, dict):
        raise VendorError(400, "The request body must be a JSON object")
    return body


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif any(ch in str(part) for ch in "[]()-,") or str(part) in ("str", "int", "float", "bool", "list", "dict"):
            break
        else:
            out += ("." if out else "") + str(part)
    return out


def _same(param: str | None) -> str | None:
    return param


def vendor_error(exc: BaseException, chat_param: Callable[[str | None], str | None] = _same) -> VendorError:
    """The vendor-neutral error for a translation, validation or serving failure, with the code
    chat completions gives it. Validation and serving errors name the translated chat request's
    fields; ``chat_param`` renames those as the vendor's request names them."""
    if isinstance(exc, VendorError):
        return exc
    if isinstance(exc, TranslationError):
        return VendorError(exc.status, exc.message, exc.param, code=exc.code)
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = _loc(tuple(first.get("loc", ())))
        param = chat_param(loc or None)
        code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_request_error"
        return VendorError(400, f"Invalid value for '{param or loc}': {first.get('msg')}", param, code=code)
    served = from_domain(exc, "messages")
    if served is not None:
        exc = served
    status = getattr(exc, "status", None)
    if isinstance(status, int) and isinstance(getattr(exc, "message", None), str):
        # A serving error: keep its status, message and code.
        return VendorError(status, exc.message, chat_param(getattr(exc, "param", None)),  # type: ignore[attr-defined]
                           getattr(exc, "headers", None), getattr(exc, "code", None))
    raise exc


async def primed(stream: AsyncIterator[dict[str, Any]]) -> tuple[dict[str, Any] | None, AsyncIterator[dict[str, Any]]]:
    """Take the first chunk now, so errors known before any output still get a status code."""
    try:
        first = await stream.__anext__()
    except StopAsyncIteration:
        return None, stream
    except BaseException:
        await _aclose(stream)
        raise
    return first, stream


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def chunks(first: dict[str, Any] | None, stream: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """The primed first chunk, then the rest; closing this closes (cancels) the generation."""
    try:
        if first is not None:
            yield first
        async for chunk in stream:
            yield chunk
    finally:
        await _aclose(stream)


T = TypeVar("T", bound=ChatStreamTranslator[Any])


@dataclass(frozen=True)
class ChatDialect(Generic[T]):
    """A vendor's chat API in terms of the chat serving layer."""

    # The vendor's request body -> an OpenAI chat request body.
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    # (completion, the vendor's request body, when it came) -> the vendor's answer.
    answer: Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]
    # (the vendor's request body, the first chat chunk) -> the stream's translator.
    translator: Callable[[dict[str, Any], dict[str, Any] | None], T]
    # One stream event as SSE bytes.
    encode: Callable[[Any], bytes]
    # The events that end a stream that failed after its 200 was sent.
    failed: Callable[[T, VendorError], list[Any]]
    shape: ErrorShape
    # Whether the stream's first chunk should carry the prompt's token count.
    prompt_usage: bool = False
    # A chat request field's name -> the vendor's name for it, in errors.
    chat_param: Callable[[str | None], str | None] = _same


async def serve_chat(request: Request, serving: ChatServing, dialect: ChatDialect[T]) -> Response:
    created = int(time.time())
    try:
        body = await read_json(request)
        req = ChatCompletionRequest.model_validate(dialect.to_chat(body))
        if not req.stream:
            return JSONResponse(dialect.answer(await serving.create(req), body, created))
        # Errors known before any output (unknown model, prompt too long) still get a status.
        first, stream = await primed(serving.stream(req, prompt_usage=dialect.prompt_usage))
    except Exception as exc:
        return respond_error(vendor_error(exc, dialect.chat_param), dialect.shape)
    translator = dialect.translator(body, first)
    encode = dialect.encode

    async def events() -> AsyncIterator[bytes]:
        for event in translator.start():
            yield encode(event)
        try:
            async for chunk in chunks(first, stream):
                for event in translator.feed(chunk):
                    yield encode(event)
        except Exception as exc:
            for event in dialect.failed(translator, vendor_error(exc, dialect.chat_param)):
                yield encode(event)
            return
        for event in translator.finish():
            yield encode(event)

    return EventStreamResponse(events())
