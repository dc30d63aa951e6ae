"""Greedy requests are sampled by numpy on the logits row (``sampling.Greedy``), and answer
token for token what llama.cpp's sampler chain answers: with a logit bias, with
log-probabilities, with several streams in one step, with drafts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import Generation, SamplingParams
from conch.inference.engines.llama import sampling

PROMPTS = ["The capital of France is", "Write a haiku about rain.", "List three colours.", "def add(a, b):"]


def test_the_first_of_equal_maxima_and_the_bias_in_float32() -> None:
    row = np.array([0.5, 2.0, 2.0, 1.0], dtype=np.float32)
    assert sampling.Greedy({}).pick(row) == 1
    assert sampling.Greedy({1: -100.0}).pick(row) == 2
    # 1 + 1.0000001 rounds to 2.0 in float32, as C's float addition does: a tie, the first wins.
    assert sampling.Greedy({3: 1.0000001}).pick(row) == 1
    assert sampling.Greedy({3: 1.000001}).pick(row) == 3
    assert row.tolist() == [0.5, 2.0, 2.0, 1.0]  # the model's row is left as it was
    assert sampling.Greedy({}).pick(np.array([np.nan, 1.0], dtype=np.float32)) == -1  # left to the chain


def test_only_greedy_chains_are_taken() -> None:
    assert sampling.greedy(SamplingParams(temperature=0.0, logit_bias={5: 2.0}), 10) is not None
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=0.0, grammar="root ::= \"a\""),
                   SamplingParams(temperature=0.0, presence_penalty=0.5),
                   SamplingParams(temperature=0.0, repeat_penalty=1.1),
                   SamplingParams(temperature=0.0, logit_bias={10: 1.0})):  # outside the vocabulary
        assert sampling.greedy(params, 10) is None


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Iterator[le.LlamaEngine]:
    eng = le.LlamaEngine("m", str(smollm2_path), n_ctx=1024, n_parallel=4, draft_max=6)
    eng.load()
    yield eng
    eng.unload()


def _streams(engine: le.LlamaEngine, by_numpy: bool, params: list[SamplingParams]) -> list[tuple[str, Any]]:
    assert engine.scheduler is not None
    engine.scheduler.greedy_by_numpy = by_numpy

    async def one(gen: Generation) -> tuple[str, Any]:
        text, lps = "", []
        async for ev in gen:
            text += ev.text
            lps += [(lp.token, round(lp.logprob, 5)) for lp in ev.logprobs or []]
        return text, lps

    async def go() -> list[tuple[str, Any]]:
        assert engine.scheduler is not None
        with engine.scheduler._cond:  # admitted together: both runs batch alike
            gens = [engine.generate(engine.format_chat([{"role": "user", "content": p}]), sp)
                    for p, sp in zip(PROMPTS, params, strict=True)]
        return list(await asyncio.gather(*[one(g) for g in gens]))

    try:
        return asyncio.run(go())
    finally:
        engine.scheduler.greedy_by_numpy = True


def test_streams_are_the_chains_token_for_token(engine: le.LlamaEngine) -> None:
    banned = {0: -100.0, 2: -100.0}  # SmolLM2's end-of-text tokens: every stream runs to its budget
    params = [SamplingParams(max_tokens=40, temperature=0.0),
              SamplingParams(max_tokens=40, temperature=0.0, logit_bias=banned, logprobs=2),
              SamplingParams(max_tokens=40, temperature=0.0, logit_bias={**banned, 28: 5.0}),
              SamplingParams(max_tokens=40, temperature=0.0, logprobs=0)]
    chain = _streams(engine, False, params)
    assert _streams(engine, True, params) == chain
    assert all(text for text, _ in chain) and len(chain[1][1]) == 40


def test_a_forced_token_wins_every_step(engine: le.LlamaEngine) -> None:
    forced = engine.tokenize(" yes", add_bos=False)[0]
    params = [SamplingParams(max_tokens=5, temperature=0.0, logit_bias={forced: 100.0})] * 4
    assert all(text == " yes" * 5 for text, _ in _streams(engine, True, params))
