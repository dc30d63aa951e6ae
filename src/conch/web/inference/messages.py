"""Anthropic Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Translated to a chat request (``conch.inference.api.anthropic``), served by the chat
serving layer, translated back. The API key may come as ``x-api-key`` (Anthropic's clients)
or as a bearer token; ``anthropic-version`` is accepted. Errors use Anthropic's
``{"type": "error", "error": {...}}`` shape, a refusal of the key's limits included
(``rate_limit_error``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from conch.inference.api import anthropic as a
from conch.inference.api.openai import ChatCompletionRequest
from conch.web.common.sse import encode_event
from conch.web.inference.compat import ChatDialect, read_json, serve_chat, validated
from conch.web.inference.deps import ChatDep
from conch.web.inference.errors import ANTHROPIC, AnthropicRoute
from conch.web.inference.metering import meter

router = APIRouter(tags=["anthropic"], route_class=AnthropicRoute)


def _encode(event: a.Event) -> bytes:
    name, data = event
    return encode_event(data, event=name)


DIALECT = ChatDialect(
    to_chat=a.messages_to_chat,
    answer=lambda completion, body, _created: a.chat_to_message(completion, body["model"]),
    translator=lambda body, first: a.MessageStream(
        body["model"], input_tokens=((first or {}).get("usage") or {}).get("prompt_tokens", 0),
        msg_id=a.message_id((first or {}).get("id"))),
    encode=_encode,
    failed=lambda _translator, err: [("error", ANTHROPIC.body(err))],
    envelope=ANTHROPIC,
    prompt_usage=True,
)

_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "messages", "max_tokens"],
    "description": "An Anthropic Messages API request (https://docs.anthropic.com/en/api/messages)."}}}}}


@router.post("/v1/messages", openapi_extra=_BODY, summary="Anthropic Messages API",
             responses={200: {"content": {"text/event-stream": {}}, "description": "A message, or stream events"}})
async def create_message(request: Request, serving: ChatDep) -> Any:
    return await serve_chat(request, serving, DIALECT)


@router.post("/v1/messages/count_tokens", openapi_extra=_BODY, summary="Count the input tokens of a Messages request")
async def count_tokens(request: Request, serving: ChatDep) -> Any:
    body = await read_json(request)
    req = validated(ChatCompletionRequest, a.messages_to_chat(body, require_max_tokens=False))
    meter(request, req.model, serving.providers)  # the key's allow-list; counting uses no tokens
    return {"input_tokens": await serving.count_prompt_tokens(req)}
