"""Chat completions as a service: an OpenAI request in, OpenAI objects out (no HTTP).

The pattern is vLLM's ``OpenAIServingChat``: the route validates the body into a
:class:`ChatCompletionRequest` and hands it here; :meth:`ChatServing.create` answers with a
``chat.completion`` object and :meth:`ChatServing.stream` with ``chat.completion.chunk``
objects. Everything the client did wrong, or the server could not do, is raised (an error of
:mod:`conch.errors`) before the first chunk when it can be known then, so the route can still
answer with a status code.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from conch.inference.api.openai import (
    UNSUPPORTED_CHAT_FIELDS,
    ChatCompletionRequest,
    NamedToolChoice,
)
from conch.inference.engines.base import (
    ChatSpec,
    Engine,
    SamplingParams,
    TokenLogprob,
    ToolSpec,
    Unsupported,
)
from conch.inference.engines.chat import ChatEvent, start_chat
from conch.inference.serving.base import (
    REMOTE_MAX_TOKENS,
    Bill,
    Meter,
    Serving,
    estimate_tokens,
    request_body,
    usage_tokens,
)
from conch.inference.serving.errors import InvalidRequest
from conch.inference.serving.images import (
    ImageRef,
    read_images,
    refuse_without_projector,
    take_images,
)

MAX_STOP_SEQUENCES = 4


class ChatServing(Serving):
    # -- the two entry points ------------------------------------------------------------
    async def create(self, req: ChatCompletionRequest, meter: Meter | None = None) -> dict[str, Any]:
        """A whole ``chat.completion`` object (``meter``: the request's token budget, told
        before generation and settled at the end: :class:`~.base.Meter`)."""
        remote = self.remote(req.model)
        if remote is not None:
            provider, name = remote
            body = request_body(req)
            if meter is None:
                return await provider.chat(name, body)
            prompt = estimate_tokens(body.get("messages"))
            await meter.reserve(req.model, prompt, req.n * _remote_max(req))
            used = 0  # refused or failed upstream: nothing to bill
            try:
                out = await provider.chat(name, body)
                used = usage_tokens(out) or prompt
                return out
            finally:
                await meter.settle(used)
        t_start = time.perf_counter()
        spec = await self._local_spec(req)
        record = self.resolver.local_record(req.model, "chat")
        texts = [""] * spec.n
        calls: list[list[dict[str, Any]] | None] = [None] * spec.n
        reasons = ["stop"] * spec.n
        stop_hits: list[str | None] = [None] * spec.n
        logprobs: list[list[dict[str, Any]]] = [[] for _ in range(spec.n)]
        n_out = 0
        n_prompt = 0
        first: float | None = None
        bill = Bill(meter)
        async with self.lease(record, req.keep_alive) as engine:
            n_prompt, events = await _start(engine, spec, req, bill)
            try:
                async for ev in events:
                    if first is None:
                        first = time.perf_counter()
                    if ev.logprobs:
                        logprobs[ev.index].extend(logprob_entries(ev.logprobs))
                    if ev.kind == "delta":
                        texts[ev.index] += ev.text
                    elif ev.kind == "tool_calls":
                        calls[ev.index] = ev.tool_calls
                    else:
                        reasons[ev.index] = ev.finish_reason or "stop"
                        stop_hits[ev.index] = ev.stop_sequence
                        n_out += ev.completion_tokens
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                self.metrics.observe_generation(
                    None if first is None else first - t_start, time.perf_counter() - t_start, n_prompt, n_out
                )
                await bill.settle(n_out)
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
                    "logprobs": {"content": logprobs[i], "refusal": None} if req.logprobs else None,
                    # vLLM's extension: the stop string that ended the choice (the Anthropic
                    # translation reports it as stop_sequence).
                    **({"stop_reason": stop_hits[i]} if stop_hits[i] is not None else {}),
                }
                for i in range(spec.n)
            ],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "system_fingerprint": None,
        }

    async def count_prompt_tokens(self, req: ChatCompletionRequest) -> int:
        """Tokens of the prompt ``req`` renders to (template, tools and constraints applied),
        as ``usage.prompt_tokens`` of the same request counts them; nothing is generated."""
        spec = await self._local_spec(req)
        record = self.resolver.local_record(req.model, "chat")
        async with self.lease(record, req.keep_alive) as engine:
            _check_engine(engine, spec, req)
            return len(engine.chat_prompt(spec).tokens)

    async def stream(
        self, req: ChatCompletionRequest, *, prompt_usage: bool = False, meter: Meter | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """``chat.completion.chunk`` objects as tokens come; closing the iterator cancels generation.

        Setup errors (unknown model, bad fields, a full queue, a prompt too long) are raised
        by the first ``__anext__``, before any chunk; a failure later is raised mid-stream.
        With ``prompt_usage`` the first chunk of a local model carries ``usage`` with the
        prompt's tokens (Anthropic's ``message_start`` reports them); OpenAI's chunks carry
        none before the last.
        """
        remote = self.remote(req.model)
        if remote is not None:
            # Opening the upstream happens here, at the first ``anext``: whatever goes wrong
            # before its first chunk is raised before any of ours (the route's status).
            provider, name = remote
            body = request_body(req)
            if meter is None:
                chunks = await provider.chat_stream(name, body)
                try:
                    async for c in chunks:
                        yield c
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]  # closes the upstream request
                return
            # Metered: reserved on an estimate, settled from the provider's usage when it
            # gives one, else the estimate and a token per chunk of text.
            estimate = estimate_tokens(body.get("messages"))
            await meter.reserve(req.model, estimate, req.n * _remote_max(req))
            used: int | None = None
            pieces = 0
            try:
                chunks = await provider.chat_stream(name, body)
                try:
                    async for c in chunks:
                        used = usage_tokens(c) or used
                        pieces += sum(1 for ch in c.get("choices") or () if (ch.get("delta") or {}).get("content"))
                        yield c
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]
            finally:
                await meter.settle(used if used is not None else estimate + pieces if pieces else 0)
            return
        t_start = time.perf_counter()
        spec = await self._local_spec(req)
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
        bill = Bill(meter)
        with contextlib.ExitStack() as finish:
            async with self.lease(record, req.keep_alive) as engine:
                n_prompt, events = await _start(engine, spec, req, bill)
                finish.callback(
                    lambda: self.metrics.observe_generation(
                        None if first is None else first - t_start, time.perf_counter() - t_start, n_prompt, n_out
                    )
                )
                try:
                    for i in range(spec.n):
                        usage = {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt}
                        yield chunk([_choice(i, {"role": "assistant", "content": ""})],
                                    usage if prompt_usage and i == 0 else None)
                    async for ev in events:
                        if first is None:
                            first = time.perf_counter()
                        yield chunk([_event_choice(ev, req.logprobs)])
                        if ev.kind == "finish":
                            n_out += ev.completion_tokens
                    if include_usage:
                        yield chunk([], {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                         "total_tokens": n_prompt + n_out})
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
                    await bill.settle(n_out)


    async def _local_spec(self, req: ChatCompletionRequest) -> ChatSpec:
        """The chat for a local model, its images read: refused (400 naming the first image's
        field) before anything is read or fetched when the model has no projector."""
        refs: list[ImageRef] = []
        spec = chat_spec(req, refs)
        if refs:
            record = self.resolver.local_record(req.model, "chat")
            if "vision" not in record.capabilities:
                refuse_without_projector(req.model, refs)
            spec.images = await read_images(refs, self.manager.settings)
        return spec


def chat_spec(req: ChatCompletionRequest, images: list[ImageRef] | None = None) -> ChatSpec:
    """The engine-neutral chat a request asks for (raises ``InvalidRequest`` naming the field).
    Image parts become ``{"type": "image"}`` parts; what they name goes into ``images`` (refused
    when no list is given)."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed", where="stop")
    tools = [
        ToolSpec(t.function.name, t.function.description, t.function.parameters or {"type": "object", "properties": {}})
        for t in req.tools or []
    ]
    _refuse_unsupported(req)
    named: str | None = None
    if isinstance(req.tool_choice, NamedToolChoice):
        tool_choice, named = "function", req.tool_choice.function.name
    else:
        tool_choice = req.tool_choice or ("auto" if tools else "none")
    if tool_choice != "none" and not tools:
        raise InvalidRequest("tool_choice requires tools", where="tool_choice")
    messages = [m.model_dump() for m in req.messages]
    refs = take_images(messages)
    if refs and images is None:
        raise InvalidRequest("images are not supported here", where=refs[0].where, code="unsupported_parameter")
    if images is not None:
        images.extend(refs)
    return ChatSpec(
        messages=messages,
        sampling=SamplingParams(
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=0.7 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            typical_p=1.0 if req.typical_p is None else req.typical_p,
            repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
            repeat_last_n=64 if req.repeat_last_n is None else req.repeat_last_n,
        ),
        n=req.n,
        tools=tools,
        tool_choice=tool_choice,
        named_tool=named,
        response_format=req.response_format.model_dump(by_alias=True) if req.response_format is not None else None,
    )


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    """OpenAI fields conch does not implement are refused by name, never silently dropped."""
    for name in UNSUPPORTED_CHAT_FIELDS:
        if getattr(req, name) is not None:
            raise InvalidRequest(f"'{name}' is not supported by conch", where=name, code="unsupported_parameter")
    if req.modalities is not None and req.modalities != ["text"]:
        raise InvalidRequest("Only 'modalities: [\"text\"]' is supported by conch", where="modalities",
                             code="unsupported_parameter")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs: true'", where="top_logprobs")
    for i, m in enumerate(req.messages):
        for j, call in enumerate(m.tool_calls or []):
            try:
                json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidRequest(
                    f"messages[{i}] (the {m.role} message) has tool call {j} whose arguments are not valid JSON: {exc}",
                    where=f"messages[{i}].tool_calls[{j}].function.arguments",
                )


def logit_bias(bias: dict[str, float] | None, n_vocab: int) -> dict[int, float]:
    """``{"token id": bias}`` checked against the vocabulary and the -100..100 range."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            tok = int(key)
        except ValueError:
            raise InvalidRequest(f"'logit_bias' keys must be token ids; got {key!r}", where="logit_bias")
        if not 0 <= tok < n_vocab:
            raise InvalidRequest(f"'logit_bias' token {tok} is outside the vocabulary (0..{n_vocab - 1})",
                                 where="logit_bias")
        if not -100 <= value <= 100:
            raise InvalidRequest(f"'logit_bias' values must be between -100 and 100; got {value}", where="logit_bias")
        out[tok] = float(value)
    return out


def logprob_entries(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Engine log-probabilities in OpenAI's shape ``{token, logprob, bytes, top_logprobs}``."""
    return [
        {"token": t.piece.decode("utf-8", "replace"), "logprob": t.logprob, "bytes": list(t.piece),
         "top_logprobs": [{"token": p.decode("utf-8", "replace"), "logprob": lp, "bytes": list(p)} for _, p, lp in t.top]}
        for t in items
    ]


def _check_engine(engine: Engine, spec: ChatSpec, req: ChatCompletionRequest) -> None:
    if "chat" not in engine.capabilities:
        # Capabilities already say so for converted models; a hand-registered record may not.
        raise Unsupported(f"The model '{engine.model_id}' does not support chat")
    if req.logit_bias:
        spec.sampling.logit_bias = logit_bias(req.logit_bias, engine.n_vocab)


def _remote_max(req: ChatCompletionRequest) -> int:
    """The most a remote choice may generate, as far as conch knows."""
    return req.max_completion_tokens or req.max_tokens or REMOTE_MAX_TOKENS


async def _start(
    engine: Engine, spec: ChatSpec, req: ChatCompletionRequest, bill: Bill
) -> tuple[int, AsyncIterator[ChatEvent]]:
    _check_engine(engine, spec, req)
    prompt = engine.chat_prompt(spec)
    n_prompt = len(prompt.tokens)
    # The most the choices may generate: their max_tokens, or the room left in the context.
    room = max(0, engine.n_ctx - n_prompt)
    most = min(prompt.sampling.max_tokens, room) if prompt.sampling.max_tokens else room
    await bill.reserve(req.model, n_prompt, spec.n * most)
    try:
        events = start_chat(engine, spec, prompt, bill.gens)
    except BaseException:
        await bill.settle(0)
        raise
    bill.started = True
    return n_prompt, events


def _choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
            logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}


def _event_choice(ev: ChatEvent, with_logprobs: bool = False) -> dict[str, Any]:
    lp = {"content": logprob_entries(ev.logprobs or []), "refusal": None} if with_logprobs and ev.logprobs else None
    if ev.kind == "delta":
        return _choice(ev.index, {"content": ev.text}, logprobs=lp)
    if ev.kind == "tool_calls":
        deltas = [
            {"index": k, "id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for k, c in enumerate(ev.tool_calls or [])
        ]
        return _choice(ev.index, {"tool_calls": deltas}, logprobs=lp)
    choice = _choice(ev.index, {}, ev.finish_reason, logprobs=lp)
    if ev.stop_sequence is not None:
        choice["stop_reason"] = ev.stop_sequence
    return choice
