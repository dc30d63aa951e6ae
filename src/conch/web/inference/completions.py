"""``POST /v1/completions``: OpenAI's legacy completions, on the engines' low-level generation.

The plain answer is a ``text_completion`` object; with ``stream`` it is SSE chunks of the same
object (``choices[].text``) ending with ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from conch.inference.protocols.completions import CompletionRequest
from conch.inference.serving.completions import CompletionServing
from conch.web.inference.chat import openai_sse  # the same SSE framing as chat
from conch.web.inference.responses import errors

router = APIRouter(tags=["completions"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def completion_serving(request: Request) -> CompletionServing:
    return request.app.state.completions  # type: ignore[no-any-return]


@router.post("/v1/completions", responses={**errors(), 200: {"content": {"text/event-stream": {}},
                                                             "description": "A text_completion, or SSE chunks when stream is true"}})
async def completions(req: CompletionRequest, serving: CompletionServing = Depends(completion_serving)) -> Any:
    if not req.stream:
        return await serving.create(req)
    chunks = serving.stream(req)
    # Errors known before generation are raised here and answered with their status.
    first = await anext(chunks)  # type: ignore[call-overload]
    return StreamingResponse(openai_sse(first, chunks), media_type="text/event-stream", headers=SSE_HEADERS)


# -- for the Ollama routes (raw and fill-in-the-middle /api/generate) -------------------------
def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    return CompletionRequest.model_validate(body)


def completion_chunks(request: Request, req: CompletionRequest) -> AsyncIterator[dict[str, Any]]:
    return completion_serving(request).stream(req)
