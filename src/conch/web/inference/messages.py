"""Anthropic Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Translated to a chat request (``conch.inference.protocols.anthropic``), served by the chat
serving layer, translated back. ``x-api-key`` and ``anthropic-version`` are accepted (a local
server needs no key); errors use Anthropic's ``{"type": "error", "error": {...}}`` shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conch.inference.protocol.openai import ChatCompletionRequest
from conch.inference.protocols import anthropic as a
from conch.web.inference.compat import (
    STREAM_HEADERS,
    VendorError,
    chat_serving,
    chunks,
    count_chat_tokens,
    primed,
    read_json,
    respond_error,
    vendor_error,
)

router = APIRouter(tags=["anthropic"])


def _shape(status: int, message: str, param: str | None) -> dict[str, Any]:
    return a.error_body(status, message)


_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "messages", "max_tokens"],
    "description": "An Anthropic Messages API request (https://docs.anthropic.com/en/api/messages)."}}}}}


@router.post("/v1/messages", openapi_extra=_BODY, summary="Anthropic Messages API",
             responses={200: {"content": {"text/event-stream": {}}, "description": "A message, or stream events"}})
async def create_message(request: Request) -> Any:
    serving = chat_serving(request)
    try:
        body = await read_json(request)
        req = ChatCompletionRequest.model_validate(a.messages_to_chat(body))
        if not req.stream:
            completion = await serving.create(req)
            return JSONResponse(a.chat_to_message(completion, body["model"]))
        first, stream = await primed(serving.stream(req))
    except Exception as exc:
        return respond_error(vendor_error(exc), _shape)

    translator = a.MessageStream(body["model"], msg_id=a.message_id((first or {}).get("id")))

    async def events() -> AsyncIterator[str]:
        for ev in translator.start():
            yield a.sse(ev)
        try:
            async for chunk in chunks(first, stream):
                for ev in translator.feed(chunk):
                    yield a.sse(ev)
        except Exception as exc:
            err = vendor_error(exc)
            yield a.sse(("error", a.error_body(err.status, err.message)))
            return
        for ev in translator.finish():
            yield a.sse(ev)

    return StreamingResponse(events(), media_type="text/event-stream", headers=STREAM_HEADERS)


@router.post("/v1/messages/count_tokens", openapi_extra=_BODY, summary="Count the input tokens of a Messages request")
async def count_tokens(request: Request) -> Any:
    try:
        body = await read_json(request)
        chat = a.messages_to_chat(body, require_max_tokens=False)
        req = ChatCompletionRequest.model_validate(chat)
        n = await count_chat_tokens(request, req)
    except Exception as exc:
        return respond_error(vendor_error(exc), _shape)
    return {"input_tokens": n}


__all__ = ["VendorError", "router"]
