"""Text made while the next step computes (``Scheduler.overlap_text``) changes no output.

With every layer on a GPU, the scheduler turns a step's tokens into text (detokenizing, stop
strings, events) after it has queued the next step. The engine switches it on only then; here
it is switched on for a CPU engine, where the same code runs in the same order, and every
stream must come out as it does without it: text, finish reason, token counts, the stop
string, log-probabilities, with drafts, preemption and cancellation. And requests given up
while they wait leave the queue at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import Generation, SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "List five fruits and say why you like each.",
    "Explain how a bicycle works.",
    "Describe the sea at night.",
]
CODE = "def area(w, h):\n    result = w * h\n    return result\n"
COPY = f"Rewrite this function, renaming result to out. Reply with the code only.\n\n{CODE}"


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Iterator[le.LlamaEngine]:
    # A small pool (1,280 cells: one context shared by all) that four long streams outgrow:
    # some get preempted.
    eng = le.LlamaEngine("m", str(smollm2_path), n_ctx=1280, n_parallel=4, draft_max=6)
    eng.load()
    assert eng.scheduler is not None and eng.scheduler.overlap_text is False  # CPU: off by default
    yield eng
    eng.unload()


Stream = tuple[str, int, str | None, str | None, list[Any]]


def _streams(engine: le.LlamaEngine, overlap: bool, jobs: list[tuple[str, SamplingParams]]) -> list[Stream]:
    assert engine.scheduler is not None
    engine.scheduler.overlap_text = overlap

    async def one(gen: Generation) -> Stream:
        text, n, reason, stop, logprobs = "", 0, None, None, []
        async for ev in gen:
            text += ev.text
            n = ev.n_tokens
            reason = ev.finish_reason or reason
            stop = ev.stop_sequence or stop
            logprobs += [(lp.token, round(lp.logprob, 4), [t for t, _, _ in lp.top]) for lp in ev.logprobs or []]
        return text, n, reason, stop, logprobs

    async def go() -> list[Stream]:
        assert engine.scheduler is not None
        # Admitted together, so that both runs batch (and preempt) alike.
        with engine.scheduler._cond:
            gens = [engine.generate(engine.format_chat([{"role": "user", "content": p}]), params) for p, params in jobs]
        return list(await asyncio.gather(*[one(gen) for gen in gens]))

    try:
        return asyncio.run(go())
    finally:
        engine.scheduler.overlap_text = False


def _both(engine: le.LlamaEngine, jobs: list[tuple[str, SamplingParams]]) -> list[Stream]:
    plain = _streams(engine, False, jobs)
    assert _streams(engine, True, jobs) == plain
    return plain


def test_greedy_streams_and_token_budgets(engine: le.LlamaEngine) -> None:
    jobs = [(p, SamplingParams(max_tokens=n, temperature=0.0)) for p, n in zip(PROMPTS, (1, 2, 17, 40), strict=True)]
    out = _both(engine, jobs)
    assert [(n, reason) for _, n, reason, _, _ in out] == [(1, "length"), (2, "length"), (17, "length"), (40, "length")]
    assert all(text for text, *_ in out)


def test_stop_strings_end_streams_at_the_same_token(engine: le.LlamaEngine) -> None:
    greedy = _streams(engine, False, [(p, SamplingParams(max_tokens=40, temperature=0.0)) for p in PROMPTS])
    # A stop string from the middle of each answer, and one that never comes.
    stops = [text[len(text) // 2 : len(text) // 2 + 4] for text, *_ in greedy]
    jobs = [(p, SamplingParams(max_tokens=40, temperature=0.0, stop=[s, "never-said"]))
            for p, s in zip(PROMPTS, stops, strict=True)]
    out = _both(engine, jobs)
    for (text, n, reason, stop, _), (full, *_), s in zip(out, greedy, stops, strict=True):
        assert reason == "stop" and stop == s
        assert full.startswith(text) and s not in text and n < 40


def test_log_probabilities_and_seeded_sampling(engine: le.LlamaEngine) -> None:
    jobs = [(p, SamplingParams(max_tokens=12, temperature=0.8, seed=i, logprobs=3)) for i, p in enumerate(PROMPTS)]
    out = _both(engine, jobs)
    assert all(len(lps) == n == 12 for _, n, _, _, lps in out)


def test_drafted_tokens_and_a_stop_inside_a_draft(engine: le.LlamaEngine) -> None:
    before = engine.stats.draft_accepted_tokens
    plain = _both(engine, [(COPY, SamplingParams(max_tokens=60, temperature=0.0))])
    assert engine.stats.draft_accepted_tokens > before  # the copy was drafted
    text = plain[0][0]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    out = _both(engine, [(COPY, SamplingParams(max_tokens=60, temperature=0.0, stop=[stop]))])
    assert out[0][2] == "stop" and text.startswith(out[0][0])


def test_preempted_streams_resume_with_the_same_text(engine: le.LlamaEngine) -> None:
    jobs = [(p * 6, SamplingParams(max_tokens=200, temperature=0.0, stop=["\n\n\n"])) for p in PROMPTS]
    out = _both(engine, jobs)
    assert all(n > 0 for _, n, *_ in out)


def test_a_cancelled_stream_leaves_the_others_running(engine: le.LlamaEngine) -> None:
    assert engine.scheduler is not None
    engine.scheduler.overlap_text = True
    params = SamplingParams(max_tokens=30, temperature=0.0)

    async def go() -> tuple[int, str]:
        messages = [{"role": "user", "content": PROMPTS[0]}]
        cancelled = engine.generate(engine.format_chat(messages), params)
        other = engine.generate(engine.format_chat([{"role": "user", "content": PROMPTS[1]}]), params)
        seen = 0
        async for _ in cancelled:
            seen += 1
            if seen == 3:
                break
        text = "".join([ev.text async for ev in other])
        return seen, text

    try:
        seen, text = asyncio.run(go())
    finally:
        engine.scheduler.overlap_text = False
    assert seen == 3
    alone = _streams(engine, False, [(PROMPTS[1], params)])[0][0]
    assert text == alone
    assert engine.scheduler.active_sequences == 0


def test_requests_given_up_in_the_queue_leave_it_at_once(engine: le.LlamaEngine) -> None:
    """Clients that disconnect while their requests wait (a burst of them, faster than a step)
    must not fill the queue: the next requests are served, not answered 429."""
    assert engine.scheduler is not None
    scheduler = engine.scheduler
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prompt = engine.format_chat([{"role": "user", "content": PROMPTS[0]}])

    async def go() -> str:
        # Hold the worker out of its admission while more than max_queue requests come and go.
        with scheduler._cond:
            for _ in range(scheduler.max_queue + 8):
                engine.generate(prompt, params).cancel()
            assert scheduler.queued == 0
        return "".join([ev.text async for ev in engine.generate(prompt, params)])

    assert asyncio.run(go())
    assert scheduler.queued == 0 and scheduler.active_sequences == 0
