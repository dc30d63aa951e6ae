"""``POST /v1/chat/completions``: validate, call :class:`ChatServing`, shape JSON or SSE."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from conch.inference.protocol.openai import ChatCompletion, ChatCompletionRequest
from conch.inference.serving.chat import ChatServing
from conch.inference.serving.errors import ServingError
from conch.web.inference.deps import chat_serving
from conch.web.inference.responses import errors

router = APIRouter(tags=["chat"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={**errors(), 200: {"content": {"text/event-stream": {}},
                                 "description": "A completion, or SSE chunks when stream is true"}},
)
async def chat_completions(req: ChatCompletionRequest, chat: ChatServing = Depends(chat_serving)) -> Any:
    if not req.stream:
        return await chat.create(req)
    chunks = chat.stream(req)
    # The first chunk comes after the model is leased and generation started: anything wrong
    # with the request is raised here and answered with its status, not inside a 200 stream.
    first = await anext(chunks)  # type: ignore[call-overload]
    return StreamingResponse(openai_sse(first, chunks), media_type="text/event-stream", headers=SSE_HEADERS)


def _frame(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def openai_sse(first: dict[str, Any], chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        yield _frame(first)
        async for chunk in chunks:
            yield _frame(chunk)
        yield "data: [DONE]\n\n"
    except ServingError as err:
        yield _frame(err.body())
    finally:
        # A client disconnect lands here too: closing the chunks cancels the generation.
        await chunks.aclose()  # type: ignore[attr-defined]
