"""Legacy completions as a service: a prompt (no chat template) in, ``text_completion`` out.

Built on the engine's low-level ``generate`` (the same entry point chat uses under its
template), so sampling, batching, logit bias and log-probabilities are chat's. Each prompt
gets ``n`` choices, indexed prompt-major as OpenAI does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from conch.inference.api import completions as c
from conch.inference.api.openai import StreamOptions
from conch.inference.engines.base import (
    Engine,
    EngineError,
    Generation,
    SamplingParams,
    Unsupported,
)
from conch.inference.serving.base import Bill, Meter, Serving
from conch.inference.serving.chat import logit_bias, logprob_entries
from conch.inference.serving.errors import InvalidRequest


@dataclass
class _Choice:
    index: int
    echo: str = ""
    text: str = ""
    finish_reason: str | None = None
    n_tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class CompletionServing(Serving):
    prompt_field = "prompt"

    def _sampling(self, req: c.CompletionRequest, engine: Engine) -> SamplingParams:
        return SamplingParams(
            max_tokens=req.max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=c.stop_list(req),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=logit_bias(req.logit_bias, engine.n_vocab),
            logprobs=req.logprobs,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            typical_p=1.0 if req.typical_p is None else req.typical_p,
            repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
            repeat_last_n=64 if req.repeat_last_n is None else req.repeat_last_n,
        )

    def _prompt_tokens(self, engine: Engine, req: c.CompletionRequest, prompt: str | list[int], i: int) -> list[int]:
        if req.suffix is not None:
            if not isinstance(prompt, str):
                raise InvalidRequest("'suffix' needs a text prompt", where="suffix")
            try:
                return engine.fim_prompt(prompt, req.suffix)
            except Unsupported as exc:
                raise InvalidRequest(str(exc), where="suffix", code="unsupported_parameter")
        if isinstance(prompt, str):
            return engine.text_prompt(prompt)
        bad = [t for t in prompt if not 0 <= t < engine.n_vocab]
        if bad:
            raise InvalidRequest(f"'prompt[{i}]' has token ids outside the vocabulary (0..{engine.n_vocab - 1}): {bad[:5]}",
                                 where="prompt")
        return prompt

    async def stream(
        self, req: c.CompletionRequest, *, chat_logprobs: bool = False, meter: Meter | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """``text_completion`` chunks (OpenAI's legacy stream shape); closing cancels generation.

        Errors known before generation (unknown model, bad fields, a full queue, a prompt too
        long) are raised by the first ``__anext__``. With ``chat_logprobs`` a choice's
        ``logprobs`` are chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}``, for
        translations the legacy shape would lose bytes and same-text alternatives to.
        ``meter``: the request's token budget (:class:`~.base.Meter`), told the prompts'
        tokens and the most the choices may generate before they start, settled at the end.
        """
        t_start = time.perf_counter()
        c.check(req)
        prompts = c.prompts(req)
        record = self.resolver.local_record(req.model, "chat")
        cid, created = c.new_id(), int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
            return c.completion(cid, req.model, choices, usage, created)  # type: ignore[arg-type]

        first: float | None = None
        n_prompt = n_out = 0
        bill = Bill(meter)
        with contextlib.ExitStack() as finish:
            async with self.lease(record, req.keep_alive) as engine:
                if "chat" not in engine.capabilities:
                    raise Unsupported(f"The model '{engine.model_id}' cannot generate text")
                base = self._sampling(req, engine)
                token_prompts = [self._prompt_tokens(engine, req, p, i) for i, p in enumerate(prompts)]
                n_prompt = sum(len(t) for t in token_prompts)
                most = sum(
                    min(req.max_tokens, room) if req.max_tokens is not None else room
                    for room in (max(0, engine.n_ctx - len(t)) for t in token_prompts)
                )
                await bill.reserve(req.model, n_prompt, req.n * most)
                choices: list[_Choice] = []
                gens = bill.gens
                queue: asyncio.Queue[tuple[_Choice, Any] | None] = asyncio.Queue()
                try:
                    for i, tokens in enumerate(token_prompts):
                        echo = engine.detokenize(tokens) if req.echo and not isinstance(prompts[i], str) else str(prompts[i])
                        for j in range(req.n):
                            params = base if base.seed is None else replace(base, seed=base.seed + j)
                            choice = _Choice(i * req.n + j, echo=echo if req.echo else "")
                            choices.append(choice)
                            if req.max_tokens == 0:
                                choice.finish_reason = "length"
                                continue
                            gens.append(engine.generate(tokens, replace(params, max_tokens=req.max_tokens)))
                except BaseException:
                    for g in gens:
                        g.cancel()
                    await bill.settle(0)
                    raise
                bill.started = True
                finish.callback(lambda: self.metrics.observe_generation(
                    None if first is None else first - t_start, time.perf_counter() - t_start, n_prompt, n_out))
                running = [ch for ch in choices if ch.finish_reason is None]

                async def pump(ch: _Choice, gen: Generation) -> None:
                    try:
                        async for ev in gen:
                            await queue.put((ch, ev))
                    finally:
                        await queue.put(None)

                tasks = [asyncio.create_task(pump(ch, g)) for ch, g in zip(running, gens, strict=True)]
                try:
                    for ch in choices:
                        if ch.echo:
                            yield chunk([c.choice(ch.index, ch.echo, None, None)])
                    for ch in choices:
                        if ch.finish_reason is not None:
                            yield chunk([c.choice(ch.index, "", ch.finish_reason, None)])
                    done = 0
                    while done < len(tasks):
                        item = await queue.get()
                        if item is None:
                            done += 1
                            continue
                        ch, ev = item
                        if first is None:
                            first = time.perf_counter()
                        if ev.finish_reason == "error":
                            raise EngineError(ev.error or "generation failed")
                        lp = None
                        if req.logprobs is not None and ev.logprobs:
                            entries = logprob_entries(ev.logprobs)
                            lp = ({"content": entries} if chat_logprobs
                                  else c.legacy_logprobs(entries, len(ch.echo) + len(ch.text)))
                        ch.text += ev.text
                        if ev.finish_reason is not None:
                            ch.finish_reason = "length" if ev.finish_reason == "length" else "stop"
                            n_out += ev.n_tokens
                            yield chunk([c.choice(ch.index, ev.text, ch.finish_reason, lp)])
                        elif ev.text or lp:
                            yield chunk([c.choice(ch.index, ev.text, None, lp)])
                    if include_usage:
                        yield chunk([], c.usage(n_prompt, n_out))
                finally:
                    for g in gens:
                        g.cancel()
                    for t in tasks:
                        t.cancel()
                    await bill.settle(n_out)

    async def create(self, req: c.CompletionRequest, meter: Meter | None = None) -> dict[str, Any]:
        """A whole ``text_completion`` object (the stream, collected)."""
        texts: dict[int, str] = {}
        reasons: dict[int, str] = {}
        logprobs: dict[int, dict[str, list[Any]]] = {}
        usage = None
        cid = None
        full = req.model_copy(update={"stream_options": StreamOptions(include_usage=True)})
        async for chunk in self.stream(full, meter=meter):
            cid = chunk["id"]
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk["choices"]:
                k = ch["index"]
                texts[k] = texts.get(k, "") + ch["text"]
                if ch["finish_reason"]:
                    reasons[k] = ch["finish_reason"]
                if ch["logprobs"]:
                    acc = logprobs.setdefault(k, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
                    for key in acc:
                        acc[key].extend(ch["logprobs"][key])
        n = len(texts)
        choices = [c.choice(k, texts[k], reasons.get(k, "stop"),
                            (logprobs.get(k) or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
                            if req.logprobs is not None else None) for k in range(n)]
        return c.completion(cid or c.new_id(), req.model, choices, usage or c.usage(0, 0))
