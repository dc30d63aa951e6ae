"""Speculative decoding by prompt lookup: the same output with and without it, on the real engine.

Every emitted token is drawn by the request's own sampler on the logits of the prefix it
follows, so greedy output is identical token for token and a seeded sampled one too (one draw
per token, same stream); and on an input-copying task most drafted tokens are kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.offload import RuntimeOptions, cpu_attention
from conch.inference.engines.llama.speculative import JUDGE_AFTER, NgramDrafter

CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item.price * item.quantity
    total = total * (1 + tax_rate)
    return round(total, 2)
'''
COPY = [{"role": "user", "content": f"Rewrite this function, renaming the variable total to acc. "
                                    f"Reply with the code only.\n\n{CODE}"}]


@pytest.fixture(scope="module")
def engines(smollm2_path: Path) -> Iterator[tuple[le.LlamaEngine, le.LlamaEngine]]:
    # Both as a drafting engine runs on the CPU (flash attention, micro-batches under 64:
    # offload.cpu_attention), so that the only difference is drafting itself.
    fa, ub = cpu_attention("auto")
    spec = le.LlamaEngine("spec", str(smollm2_path), n_ctx=1024, n_parallel=2, draft_max=8)
    plain = le.LlamaEngine("plain", str(smollm2_path), n_ctx=1024, n_parallel=2, draft_max=0,
                           runtime=RuntimeOptions(0, 0, fa, "f16", ub, 1024, False))
    assert spec.runtime == plain.runtime
    spec.load()
    plain.load()
    yield spec, plain
    spec.unload()
    plain.unload()


def _run(engine: le.LlamaEngine, messages: list[dict[str, str]], params: SamplingParams) -> tuple[str, list[int], str | None]:
    async def go() -> tuple[str, list[int], str | None]:
        text, toks, reason = "", [], None
        async for ev in engine.generate(engine.format_chat(messages), params):  # type: ignore[arg-type]
            text += ev.text
            toks.extend(lp.token for lp in ev.logprobs or [])
            reason = ev.finish_reason or reason
        return text, toks, reason

    return asyncio.run(go())


def test_greedy_output_is_identical_and_drafts_are_kept(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    spec, plain = engines
    params = SamplingParams(max_tokens=120, temperature=0.0, logprobs=0)
    before = spec.stats.draft_accepted_tokens, spec.stats.draft_tokens
    fast = _run(spec, COPY, params)
    slow = _run(plain, COPY, params)
    assert fast == slow
    assert len(fast[1]) > 40
    accepted = spec.stats.draft_accepted_tokens - before[0]
    drafted = spec.stats.draft_tokens - before[1]
    assert accepted > 20 and accepted <= drafted  # the copy was mostly drafted
    assert plain.stats.draft_tokens == 0


@pytest.mark.parametrize("max_tokens", [1, 7, 33])
def test_a_token_budget_ends_inside_a_draft_as_without_drafting(
    engines: tuple[le.LlamaEngine, le.LlamaEngine], max_tokens: int
) -> None:
    spec, plain = engines
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    fast = _run(spec, COPY, params)
    assert fast == _run(plain, COPY, params)
    assert len(fast[1]) == max_tokens and fast[2] == "length"


def test_stop_strings_and_seeded_sampling_are_unchanged(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    spec, plain = engines
    stop = SamplingParams(max_tokens=120, temperature=0.0, stop=["return"], logprobs=0)
    assert _run(spec, COPY, stop) == _run(plain, COPY, stop)
    sampled = SamplingParams(max_tokens=80, temperature=0.8, top_p=0.95, seed=7, logprobs=0)
    assert _run(spec, COPY, sampled) == _run(plain, COPY, sampled)


def test_the_drafter_proposes_what_followed_the_tail_and_gives_up_when_wrong() -> None:
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert d.draft(4) == [4, 5, 9, 1]  # "1 2 3" was followed by 4 5 9 1
    d.extend([7])
    assert d.draft(4) == []  # "2 3 7" and "3 7" never occurred before
    assert NgramDrafter([5, 6, 5]).draft(3) == []  # bigrams only: "6 5" has no earlier occurrence
    d = NgramDrafter([1, 2, 1, 2])
    assert d.draft(2) == [1, 2]
    for _ in range(JUDGE_AFTER):
        d.judge(1, 0)
    assert not d.enabled and d.draft(2) == []
