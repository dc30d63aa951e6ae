"""Chat completion as domain logic, engine-neutral: a :class:`ChatSpec` in, :class:`ChatEvent` out.

Nothing here knows about HTTP or about a particular runtime. The engine renders the chat
into a prompt with its own template and constraints (:meth:`Engine.chat_prompt`) and
generates (:meth:`Engine.generate`); this module starts ``n`` choices, interleaves their
events and turns text tool calls (``conch.inference.engines.tool_calls``) into structured ones.

With ``tool_choice`` "required" or a named function the engine constrains the whole output
to one call; with "auto" text streams freely, and anything that may open a tool call is held
back until it is known not to be one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from conch.inference.engines.base import (
    ChatPrompt,
    ChatSpec,
    Engine,
    EngineError,
    Generation,
    TokenLogprob,
)
from conch.inference.engines.tool_calls import parse_tool_calls, safe_prefix


@dataclass
class ChatEvent:
    kind: str  # "delta" | "tool_calls" | "finish"
    index: int
    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0
    # Log-probabilities of the tokens behind this event (when the sampling asked for them).
    logprobs: list[TokenLogprob] | None = None
    # On "finish" by a stop string: which one.
    stop_sequence: str | None = None


def start_chat(
    engine: Engine, spec: ChatSpec, prompt: ChatPrompt, gens: list[Generation] | None = None
) -> AsyncIterator[ChatEvent]:
    """Start ``spec.n`` generations now; return their events interleaved as they come.
    ``gens``: where the generations are put, for the caller to read how many tokens they
    sampled (:attr:`Generation.generated`).

    Raises ``ContextLengthExceeded``/``QueueFull`` here, before any output exists, so the
    caller can still answer with an error status.
    """
    if gens is None:
        gens = []
    try:
        for i in range(spec.n):
            sampling = prompt.sampling
            if spec.n > 1 and sampling.seed is not None:
                # One seed for every choice would make them identical; offset it per choice.
                sampling = replace(sampling, seed=sampling.seed + i)
            gens.append(engine.generate(prompt.tokens, sampling, media=prompt.media))
    except BaseException:
        for g in gens:
            g.cancel()
        raise
    return _events(spec, gens)


async def _choice_events(spec: ChatSpec, index: int, gen: Generation) -> AsyncIterator[ChatEvent]:
    """One choice's engine tokens as chat events: text deltas (held back while a tool call may
    be forming), tool calls, and the finish."""
    tools_active = spec.tools_active
    forced = tools_active and spec.tool_choice != "auto"
    text = ""
    streamed = 0
    pending: list[TokenLogprob] = []

    def event(kind: str, **fields: Any) -> ChatEvent:
        # Log-probabilities travel with the next event out for this choice.
        nonlocal pending
        out = ChatEvent(kind, index, logprobs=pending or None, **fields)
        pending = []
        return out

    async for ev in gen:
        text += ev.text
        if ev.logprobs:
            pending.extend(ev.logprobs)
        if ev.finish_reason is not None:
            if ev.finish_reason == "error":
                raise EngineError(ev.error or "generation failed")
            reason = ev.finish_reason
            if tools_active:
                content, calls = parse_tool_calls(text, spec.tools)
                if calls:
                    if not forced and len(content) > streamed:
                        yield event("delta", text=content[streamed:])
                    yield event("tool_calls", tool_calls=calls)
                    reason = "tool_calls"
                elif len(text) > streamed:
                    yield event("delta", text=text[streamed:])
            elif ev.text:
                yield event("delta", text=ev.text)
            yield event("finish", finish_reason=reason, completion_tokens=ev.n_tokens,
                        stop_sequence=ev.stop_sequence)
            return
        if not tools_active:
            if ev.text:
                yield event("delta", text=ev.text)
        elif not forced:
            cut = safe_prefix(text)
            if cut > streamed:
                yield event("delta", text=text[streamed:cut])
                streamed = cut


async def _events(spec: ChatSpec, gens: list[Generation]) -> AsyncIterator[ChatEvent]:
    if len(gens) == 1:
        # One choice, the common case: its events straight through, without a task and a
        # queue between every token and the response.
        try:
            async for only in _choice_events(spec, 0, gens[0]):
                yield only
        finally:
            gens[0].cancel()
        return
    queue: asyncio.Queue[ChatEvent | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            async for event in _choice_events(spec, index, gens[index]):
                await queue.put(event)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i)) for i in range(spec.n)]
    done = 0
    try:
        while done < len(tasks):
            item = await queue.get()
            if item is None:
                done += 1
                continue
            yield item
        for t in tasks:
            exc = t.exception()
            if exc is not None:
                raise exc
    finally:
        for g in gens:
            g.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
