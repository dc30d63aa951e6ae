"""What the routers of the other vendors' APIs share: the JSON body read and validated in the
vendor's terms, stream plumbing, and :func:`serve_chat`, a vendor's chat API (Anthropic
Messages, OpenAI Responses) described by a :class:`ChatDialect` and served by the chat
serving layer.

Each vendor API answers errors in its own shape; its router's route class names the
envelope (``errors.py``), so these routes raise like any other and read their bodies
themselves rather than letting FastAPI's validation answer in OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from conch import errors
from conch.inference.api.openai import ChatCompletionRequest
from conch.inference.api.stream import ChatStreamTranslator
from conch.inference.serving.chat import ChatServing
from conch.web.common.sse import EventStreamResponse
from conch.web.inference.errors import Envelope
from conch.web.inference.metering import meter


class VendorError(errors.DomainError):
    """The family's root: what the vendor routes refuse themselves (a body that is not JSON, a
    model the store does not have), which their APIs report without a code."""

    code = None


class BadRequest(VendorError, errors.Invalid):
    pass


class NotFound(VendorError, errors.NotFound):
    pass


class Conflict(VendorError, errors.Conflict):
    pass


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        raise BadRequest("A JSON request body is required")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("The request body is not valid JSON")
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object")
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


def _same(field: str | None) -> str | None:
    return field


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], body: dict[str, Any], field: Callable[[str | None], str | None] = _same) -> M:
    """``body`` (translated from a vendor's request) as the request ``model``; invalid, a 400
    with the code chat completions gives it. ``where`` is the translated request's field;
    the message names it as the vendor does (``field``), as the vendor's envelope will."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = _loc(tuple(first.get("loc", ())))
        code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_request_error"
        raise BadRequest(f"Invalid value for '{field(loc or None) or loc}': {first.get('msg')}",
                         where=loc or None, code=code) from None


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
    failed: Callable[[T, errors.DomainError], list[Any]]
    # How the vendor writes errors (its router's route class answers in the same).
    envelope: Envelope
    # Whether the stream's first chunk should carry the prompt's token count.
    prompt_usage: bool = False


async def serve_chat(request: Request, serving: ChatServing, dialect: ChatDialect[T]) -> Response:
    created = int(time.time())
    body = await read_json(request)
    req = validated(ChatCompletionRequest, dialect.to_chat(body), dialect.envelope.field)
    budget = meter(request, req.model, serving.providers)
    if not req.stream:
        return JSONResponse(dialect.answer(await serving.create(req, budget), body, created))
    # Errors known before any output (unknown model, prompt too long, a limit of the key)
    # still get a status.
    first, stream = await primed(
        serving.stream(req, prompt_usage=dialect.prompt_usage, meter=budget)
    )
    translator = dialect.translator(body, first)
    encode = dialect.encode

    async def events() -> AsyncIterator[bytes]:
        for event in translator.start():
            yield encode(event)
        try:
            async for chunk in chunks(first, stream):
                for event in translator.feed(chunk):
                    yield encode(event)
        except errors.DomainError as exc:
            for event in dialect.failed(translator, exc):
                yield encode(event)
            return
        for event in translator.finish():
            yield encode(event)

    return EventStreamResponse(events())
