"""Chat completions as a service: an OpenAI request in, OpenAI objects out (no HTTP).

The pattern is vLLM's ``OpenAIServingChat``: the route validates the body into a
:class:`ChatCompletionRequest` and hands it here; :meth:`ChatServing.create` answers with a
``chat.completion`` object and :meth:`ChatServing.stream` with ``chat.completion.chunk``
objects. Everything the client did wrong, or the server could not do, is raised as a
:class:`~conch.inference.serving.errors.ServingError` before the first chunk when it can be
known then, so the route can still answer with a status code.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from conch.inference.chat import ChatEvent, ChatSpec, start_chat
from conch.inference.engines.base import Engine, SamplingParams, Unsupported
from conch.inference.manager import ModelManager
from conch.inference.protocol.openai import ChatCompletionRequest, NamedToolChoice
from conch.inference.serving.errors import InvalidRequest, domain_errors
from conch.inference.serving.metrics import ServingMetrics
from conch.inference.serving.resolve import ModelResolver
from conch.inference.tool_calls import ToolSpec

MAX_STOP_SEQUENCES = 4


class ChatServing:
    def __init__(self, manager: ModelManager, resolver: ModelResolver, metrics: ServingMetrics | None = None) -> None:
        self.manager = manager
        self.resolver = resolver
        self.metrics = metrics or ServingMetrics()

    # -- the two entry points ------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest) -> dict[str, Any]:
        """A whole ``chat.completion`` object."""
        t_start = time.perf_counter()
        spec = chat_spec(req)
        record = self.resolver.local_record(req.model, "chat")
        texts = [""] * spec.n
        calls: list[list[dict[str, Any]] | None] = [None] * spec.n
        reasons = ["stop"] * spec.n
        n_out = 0
        n_prompt = 0
        first: float | None = None
        with domain_errors("messages"):
            async with self.manager.use(record.id, req.keep_alive) as engine:
                n_prompt, events = _start(engine, spec)
                try:
                    async for ev in events:
                        if first is None:
                            first = time.perf_counter()
                        if ev.kind == "delta":
                            texts[ev.index] += ev.text
                        elif ev.kind == "tool_calls":
                            calls[ev.index] = ev.tool_calls
                        else:
                            reasons[ev.index] = ev.finish_reason or "stop"
                            n_out += ev.completion_tokens
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
                    self.metrics.observe_generation(
                        None if first is None else first - t_start, time.perf_counter() - t_start, n_prompt, n_out
                    )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": (texts[i] or None) if calls[i] else texts[i],
                        "tool_calls": calls[i] or None,
                        "refusal": None,
                    },
                    "finish_reason": reasons[i],
                    "logprobs": None,
                }
                for i in range(spec.n)
            ],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "system_fingerprint": None,
        }

    async def count_prompt_tokens(self, req: ChatCompletionRequest) -> int:
        """Tokens of the prompt ``req`` renders to (template, tools and constraints applied),
        as ``usage.prompt_tokens`` of the same request counts them; nothing is generated."""
        spec = chat_spec(req)
        record = self.resolver.local_record(req.model, "chat")
        with domain_errors("messages"):
            async with self.manager.use(record.id, req.keep_alive) as engine:
                if "chat" not in engine.capabilities:
                    raise Unsupported(f"The model '{engine.model_id}' does not support chat")
                return len(engine.chat_prompt(spec).tokens)

    async def stream(self, req: ChatCompletionRequest) -> AsyncIterator[dict[str, Any]]:
        """``chat.completion.chunk`` objects as tokens come; closing the iterator cancels generation.

        Setup errors (unknown model, bad fields, a full queue, a prompt too long) are raised
        by the first ``__anext__``, before any chunk; a failure later is raised mid-stream.
        """
        t_start = time.perf_counter()
        spec = chat_spec(req)
        record = self.resolver.local_record(req.model, "chat")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = req.model

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
            # Plain dicts, not pydantic: this runs once per token on the event loop.
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": choices, "usage": usage, "system_fingerprint": None}

        n_out = 0
        n_prompt = 0
        first: float | None = None
        with domain_errors("messages"), contextlib.ExitStack() as finish:
            async with self.manager.use(record.id, req.keep_alive) as engine:
                n_prompt, events = _start(engine, spec)
                finish.callback(
                    lambda: self.metrics.observe_generation(
                        None if first is None else first - t_start, time.perf_counter() - t_start, n_prompt, n_out
                    )
                )
                try:
                    for i in range(spec.n):
                        yield chunk([_choice(i, {"role": "assistant", "content": ""})])
                    async for ev in events:
                        if first is None:
                            first = time.perf_counter()
                        yield chunk([_event_choice(ev)])
                        if ev.kind == "finish":
                            n_out += ev.completion_tokens
                    if include_usage:
                        yield chunk([], {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                         "total_tokens": n_prompt + n_out})
                finally:
                    await events.aclose()  # type: ignore[attr-defined]


def chat_spec(req: ChatCompletionRequest) -> ChatSpec:
    """The engine-neutral chat a request asks for (raises ``InvalidRequest`` naming the field)."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed", param="stop")
    tools = [
        ToolSpec(t.function.name, t.function.description, t.function.parameters or {"type": "object", "properties": {}})
        for t in req.tools or []
    ]
    named: str | None = None
    if isinstance(req.tool_choice, NamedToolChoice):
        tool_choice, named = "function", req.tool_choice.function.name
    else:
        tool_choice = req.tool_choice or ("auto" if tools else "none")
    if tool_choice != "none" and not tools:
        raise InvalidRequest("tool_choice requires tools", param="tool_choice")
    return ChatSpec(
        messages=[m.model_dump() for m in req.messages],
        sampling=SamplingParams(
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=0.7 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
        ),
        n=req.n,
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        response_format=req.response_format.model_dump(by_alias=True) if req.response_format is not None else None,
    )


def _start(engine: Engine, spec: ChatSpec) -> tuple[int, AsyncIterator[ChatEvent]]:
    if "chat" not in engine.capabilities:
        # Capabilities already say so for converted models; a hand-registered record may not.
        raise Unsupported(f"The model '{engine.model_id}' does not support chat")
    prompt = engine.chat_prompt(spec)
    return len(prompt.tokens), start_chat(engine, spec, prompt)


def _choice(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}


def _event_choice(ev: ChatEvent) -> dict[str, Any]:
    if ev.kind == "delta":
        return _choice(ev.index, {"content": ev.text})
    if ev.kind == "tool_calls":
        deltas = [
            {"index": k, "id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for k, c in enumerate(ev.tool_calls or [])
        ]
        return _choice(ev.index, {"tool_calls": deltas})
    return _choice(ev.index, {}, ev.finish_reason)
