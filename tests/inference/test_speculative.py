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
from testsupport.prompts import RENAME_PROMPT

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


# -- at the defaults: drafting on, long outputs --------------------------------------------------

CORPUS = [
    # copying: a rename over a code snippet (benchmarks/speculative.py's copying request)
    [{"role": "user", "content": RENAME_PROMPT}],
    # a reply the small model falls into repeating (benchmarks/speculative.py's repeating request)
    [{"role": "user", "content": "Explain how a bicycle works, in detail."}],
    # free text, and a count that never repeats a line
    [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}],
    [{"role": "user", "content": "List the numbers from 1 to 100, separated by commas."}],
]


@pytest.fixture(scope="module")
def at_defaults(smollm2_path: Path) -> Iterator[tuple[le.LlamaEngine, le.LlamaEngine]]:
    """The engine as the server loads it (drafting on, the training context) and the same with
    draft_max = 0."""
    spec = le.LlamaEngine("spec", str(smollm2_path))
    plain = le.LlamaEngine("plain", str(smollm2_path), draft_max=0)
    assert spec.draft_max > 0 and spec.runtime == plain.runtime
    spec.load()
    plain.load()
    yield spec, plain
    spec.unload()
    plain.unload()


@pytest.mark.timeout(1800)
def test_long_greedy_outputs_are_identical_with_drafting_at_the_defaults(
    at_defaults: tuple[le.LlamaEngine, le.LlamaEngine],
) -> None:
    """Hundreds of tokens over contexts past 512 cells, where a one-row step's attention used to
    round apart from a verified draft's: token for token the same, and the drafts pay where the
    reply copies or repeats."""
    spec, plain = at_defaults
    assert spec.scheduler is not None and spec.scheduler.kernels is not None  # the reference kernels
    params = SamplingParams(max_tokens=320, temperature=0.0, logprobs=0)
    kept_by_prompt, lengths = [], []
    for messages in CORPUS:
        before = spec.stats.draft_tokens, spec.stats.draft_accepted_tokens
        fast = _run(spec, messages, params)
        slow = _run(plain, messages, params)
        assert fast == slow, messages[0]["content"][:40]
        kept_by_prompt.append((spec.stats.draft_tokens - before[0], spec.stats.draft_accepted_tokens - before[1]))
        lengths.append(len(fast[1]))
    assert min(lengths) > 200  # long outputs: every context well past 512 cells
    drafted, kept = kept_by_prompt[1]  # the repeating reply: most of it drafted and kept
    assert kept > 100 and kept >= 0.8 * drafted
    assert plain.stats.draft_tokens == 0


@pytest.mark.timeout(900)
def test_long_seeded_sampling_is_unchanged_by_drafting(at_defaults: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    """One draw per emitted token from the request's own chain, drafted or not: a seeded
    sampled reply is the same, so its distribution is the target's."""
    spec, plain = at_defaults
    for seed in (3, 11):
        params = SamplingParams(max_tokens=200, temperature=0.7, top_p=0.9, seed=seed, logprobs=0)
        assert _run(spec, CORPUS[1], params) == _run(plain, CORPUS[1], params)
