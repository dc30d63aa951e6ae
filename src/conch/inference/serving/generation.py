"""The low-level generation entry point: a prompt and sampling parameters in, token events out.

Below chat there is plain text generation, engine-neutral: :meth:`Engine.generate` takes a
prompt (text, or token ids) and :class:`SamplingParams` and returns a running
:class:`Generation` of :class:`TokenEvent`. Chat (``conch.inference.engines.chat``) starts its choices
through it; :func:`generate` adds the model lease (load on first use, keep_alive), which is
what a legacy ``/v1/completions`` route, a benchmark or a test calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from conch.inference.engines.base import EngineError, SamplingParams, TokenEvent
from conch.inference.serving.manager import ModelManager


async def generate(
    manager: ModelManager,
    model: str,
    prompt: str | list[int],
    params: SamplingParams,
    *,
    keep_alive: float | int | str | None = None,
) -> AsyncIterator[TokenEvent]:
    """Token events of one generation with ``model``; closing the iterator cancels it.

    Errors known before the first token (unknown model, ``ContextLengthExceeded``,
    ``QueueFull``) are raised by the first ``__anext__``; a runtime failure mid-way is raised
    as ``EngineError`` instead of an ``"error"`` event.
    """
    async with manager.use(model, keep_alive) as engine:
        gen = engine.generate(prompt, params)
        try:
            async for ev in gen:
                if ev.finish_reason == "error":
                    raise EngineError(ev.error or "generation failed")
                yield ev
        finally:
            gen.cancel()
