"""OpenAI Responses API, stateless: ``POST /v1/responses`` and ``GET /v1/responses/{id}``.

Translated to a chat request (``conch.inference.api.responses``), served by the chat
serving layer, translated back into a ``response`` object or its typed stream events.
Nothing is stored: ``previous_response_id`` is refused with a 400, and
``GET /v1/responses/{id}`` answers 404 saying so (docs/apis.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from conch.inference.api import responses as r
from conch.web.common.sse import encode_event
from conch.web.inference.compat import ChatDialect, NotFound, serve_chat
from conch.web.inference.deps import ChatDep
from conch.web.inference.errors import RESPONSES, ResponsesRoute

router = APIRouter(tags=["responses"], route_class=ResponsesRoute)

DIALECT = ChatDialect(
    to_chat=r.responses_to_chat,
    answer=lambda completion, body, created: r.chat_to_response(completion, body, created_at=created),
    translator=lambda body, _first: r.ResponseStream(body),
    encode=lambda event: encode_event(event, event=event["type"]),
    failed=lambda translator, err: translator.error(err.message, err.code, RESPONSES.field(err.where)),
    envelope=RESPONSES,
)

_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "input"],
    "description": "An OpenAI Responses API request (stateless subset; see docs/apis.md)."}}}}}


@router.post("/v1/responses", openapi_extra=_BODY, summary="OpenAI Responses API (stateless)",
             responses={200: {"content": {"text/event-stream": {}}, "description": "A response, or typed stream events"}})
async def create_response(request: Request, serving: ChatDep) -> Any:
    return await serve_chat(request, serving, DIALECT)


@router.get("/v1/responses/{response_id}", summary="Responses are not stored")
async def get_response(response_id: str) -> Any:
    raise NotFound(f"Response '{response_id}' not found: {r.STATELESS}", where="response_id")
