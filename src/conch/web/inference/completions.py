"""``POST /v1/completions``: OpenAI's legacy completions, on the engines' low-level generation.

The plain answer is a ``text_completion`` object; with ``stream`` it is SSE chunks of the same
object (``choices[].text``) ending with ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from conch.inference.api.completions import CompletionRequest
from conch.web.inference.chat import openai_stream  # the same SSE framing as chat
from conch.web.inference.deps import CompletionDep
from conch.web.inference.metering import meter
from conch.web.inference.openapi import errors

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", responses={**errors(), 200: {"content": {"text/event-stream": {}},
                                                             "description": "A text_completion, or SSE chunks when stream is true"}})
async def completions(req: CompletionRequest, serving: CompletionDep, request: Request) -> Any:
    budget = meter(request, req.model, serving.providers)
    if not req.stream:
        return await serving.create(req, budget)
    return await openai_stream(serving.stream(req, meter=budget))
