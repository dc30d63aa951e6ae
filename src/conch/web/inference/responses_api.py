"""OpenAI Responses API, stateless: ``POST /v1/responses`` (module named apart from the
OpenAPI ``responses`` helpers in ``responses.py``).

Translated to a chat request (``conch.inference.protocols.responses``), served by the chat
serving layer, translated back into a ``response`` object or its typed stream events.
Nothing is stored: ``previous_response_id`` is refused with a 400, and
``GET /v1/responses/{id}`` answers 404 saying so (docs/apis.md).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conch.inference.protocol.openai import ChatCompletionRequest
from conch.inference.protocols import responses as r
from conch.web.inference.compat import (
    STREAM_HEADERS,
    VendorError,
    chat_serving,
    chunks,
    primed,
    read_json,
    respond_error,
    vendor_error,
)

router = APIRouter(tags=["responses"])


def _shape(status: int, message: str, param: str | None) -> dict[str, Any]:
    return r.error_body(status, message, param)


_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "input"],
    "description": "An OpenAI Responses API request (stateless subset; see docs/apis.md)."}}}}}


@router.post("/v1/responses", openapi_extra=_BODY, summary="OpenAI Responses API (stateless)",
             responses={200: {"content": {"text/event-stream": {}}, "description": "A response, or typed stream events"}})
async def create_response(request: Request) -> Any:
    serving = chat_serving(request)
    created = int(time.time())
    try:
        body = await read_json(request)
        req = ChatCompletionRequest.model_validate(r.responses_to_chat(body))
        if not req.stream:
            completion = await serving.create(req)
            return JSONResponse(r.chat_to_response(completion, body, created_at=created))
        first, stream = await primed(serving.stream(req))
    except Exception as exc:
        return respond_error(vendor_error(exc), _shape)

    translator = r.ResponseStream(body)

    async def events() -> AsyncIterator[str]:
        for ev in translator.start():
            yield r.sse(ev)
        try:
            async for chunk in chunks(first, stream):
                for ev in translator.feed(chunk):
                    yield r.sse(ev)
        except Exception as exc:
            err = vendor_error(exc)
            for ev in translator.error(err.message):
                yield r.sse(ev)
            return
        for ev in translator.finish():
            yield r.sse(ev)

    return StreamingResponse(events(), media_type="text/event-stream", headers=STREAM_HEADERS)


@router.get("/v1/responses/{response_id}", summary="Responses are not stored")
async def get_response(response_id: str) -> Any:
    return respond_error(VendorError(404, f"Response '{response_id}' not found: {r.STATELESS}", "response_id"), _shape)
