"""``POST /v1/chat/completions``: validate, call :class:`ChatServing`, answer JSON or SSE.

:func:`openai_stream` is the SSE answer of the OpenAI generation routes (this one and
``/v1/completions``): the serving layer's chunks, each one event, then ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from conch.errors import DomainError
from conch.inference.api.openai import ChatCompletion, ChatCompletionRequest
from conch.web.common.sse import DONE, EventStreamResponse, encode_event
from conch.web.inference.deps import ChatDep
from conch.web.inference.errors import OPENAI
from conch.web.inference.metering import meter
from conch.web.inference.openapi import errors

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={**errors(), 200: {"content": {"text/event-stream": {}},
                                 "description": "A completion, or SSE chunks when stream is true"}},
)
async def chat_completions(req: ChatCompletionRequest, chat: ChatDep, request: Request) -> Any:
    budget = meter(request, req.model, chat.providers)
    if not req.stream:
        return await chat.create(req, budget)
    return await openai_stream(chat.stream(req, meter=budget))


async def openai_stream(chunks: AsyncIterator[dict[str, Any]]) -> EventStreamResponse:
    # The first chunk comes after the model is leased and generation started: anything wrong
    # with the request is raised here and answered with its status, not inside a 200 stream.
    first = await anext(chunks)
    return EventStreamResponse(_events(first, chunks))


async def _events(first: dict[str, Any], chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        yield encode_event(first)
        async for chunk in chunks:
            yield encode_event(chunk)
        yield DONE
    except DomainError as err:
        yield encode_event(OPENAI.body(err))
    finally:
        # A client disconnect lands here too: closing the chunks cancels the generation.
        await chunks.aclose()  # type: ignore[attr-defined]
