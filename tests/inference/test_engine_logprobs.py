"""Log-probabilities and logit bias in the llama.cpp engine, checked against llama.cpp's own
logits: every reported logprob is the log-softmax of the exact logits row the engine sampled
from (captured at ``llama_sampler_sample``), and the top alternatives are that row's best."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import SamplingParams, TokenLogprob
from conch.inference.engines.llama import backend


class _RowCalls:
    """The engine's fast llama.cpp calls, keeping a copy of the logits row behind each sample."""

    def __init__(self, inner: Any, n_vocab: int) -> None:
        self._inner = inner
        self._n_vocab = n_vocab
        self.rows: list[tuple[np.ndarray, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def llama_sampler_sample(self, sampler: Any, ctx: Any, idx: int) -> int:
        import llama_cpp

        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self._n_vocab,)).copy()
        tok = int(self._inner.llama_sampler_sample(sampler, ctx, idx))
        self.rows.append((row, tok))
        return tok


def _generate(engine: le.LlamaEngine, prompt: str, params: SamplingParams) -> tuple[str, list[TokenLogprob]]:
    async def go() -> tuple[str, list[TokenLogprob]]:
        text, lps = "", []
        async for ev in engine.generate(prompt, params):
            text += ev.text
            lps.extend(ev.logprobs or [])
        return text, lps

    return asyncio.run(go())


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Any:
    eng = le.LlamaEngine("m", str(smollm2_path), n_ctx=512, n_parallel=2)
    eng.load()
    yield eng
    eng.unload()


def test_logprobs_are_log_softmax_of_the_sampled_rows(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = le.LlamaEngine("m", str(smollm2_path), n_ctx=512, n_parallel=2)
    # The worker thread binds the fast calls when it starts (in load).
    calls = _RowCalls(backend.fast_calls(), 49152)
    monkeypatch.setattr(backend, "_fast", calls)
    engine.load()
    assert engine.scheduler is not None
    engine.scheduler.greedy_by_numpy = False  # every token through the chain, where the rows are read
    try:
        text, lps = _generate(engine, "The capital of France is", SamplingParams(max_tokens=10, temperature=0, logprobs=4))
        _check_rows(engine, calls, text, lps)
    finally:
        engine.unload()


def _check_rows(engine: le.LlamaEngine, calls: _RowCalls, text: str, lps: list[TokenLogprob]) -> None:
    assert text and len(lps) == 10
    assert engine.scheduler is not None
    sampled = [(row, tok) for row, tok in calls.rows if not engine.scheduler._is_eog(tok)]
    assert len(sampled) == len(lps)
    for (row, tok), lp in zip(sampled, lps, strict=True):
        logits = row.astype(np.float64)
        log_softmax = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        assert lp.token == tok == int(np.argmax(logits))
        assert lp.logprob == pytest.approx(log_softmax[tok], abs=1e-4)
        assert lp.piece == engine.scheduler._piece(tok)
        best = list(np.argsort(-logits, kind="stable")[:4])
        assert [t for t, _, _ in lp.top] == best
        assert [v for _, _, v in lp.top] == pytest.approx([log_softmax[t] for t in best], abs=1e-4)


def test_no_logprobs_unless_asked(engine: le.LlamaEngine) -> None:
    _text, lps = _generate(engine, "Hello", SamplingParams(max_tokens=4, temperature=0))
    assert lps == []


def test_logit_bias_bans_and_forces(engine: le.LlamaEngine) -> None:
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=0)
    _text, base = _generate(engine, "The capital of France is", params)
    first = base[0].token
    _text, banned = _generate(engine, "The capital of France is",
                              SamplingParams(max_tokens=6, temperature=0, logprobs=0, logit_bias={first: -100}))
    assert first not in [t.token for t in banned]
    forced = engine.tokenize(" banana", add_bos=False)[0]
    _text, pushed = _generate(engine, "The capital of France is",
                              SamplingParams(max_tokens=3, temperature=0, logprobs=0, logit_bias={forced: 100}))
    assert [t.token for t in pushed] == [forced] * 3
    # The bias shapes sampling, not the reported distribution: the model's own logprob stays.
    assert pushed[0].logprob < -1


def test_stop_string_is_reported(engine: le.LlamaEngine) -> None:
    async def go() -> Any:
        last = None
        async for ev in engine.generate("1, 2, 3, 4, 5,", SamplingParams(max_tokens=20, temperature=0, stop=[" 8", " 7"])):
            last = ev
        return last

    last = asyncio.run(go())
    assert last.finish_reason == "stop" and last.stop_sequence == " 7"


def test_a_reader_that_falls_behind_gets_the_same_tokens_in_fewer_events(engine: Any) -> None:
    """Tokens that queue up while the reader is busy come out merged: the same text and the
    same logprobs in order as a reader that keeps up, in fewer events, the last one finishing."""
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)

    async def read(delay_first: bool) -> tuple[str, list[TokenLogprob], int, int]:
        gen = engine.generate("Count slowly from one to twenty:", params)
        events = 0
        text, lps, n = "", [], 0
        async for ev in gen:
            if delay_first and events == 0:
                # The engine runs on to the end; its tokens wait in the queue.
                for _ in range(600):
                    if not engine.busy:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.3)  # its last step's events reach the queue
            events += 1
            text += ev.text
            lps.extend(ev.logprobs or [])
            n = ev.n_tokens
        return text, lps, n, events

    prompt_text, prompt_lps, prompt_n, prompt_events = asyncio.run(read(False))
    late_text, late_lps, late_n, late_events = asyncio.run(read(True))
    assert prompt_n >= 8 and prompt_events > 2
    assert late_text == prompt_text and late_n == prompt_n
    assert [(lp.token, lp.logprob) for lp in late_lps] == [(lp.token, lp.logprob) for lp in prompt_lps]
    assert len(late_lps) == prompt_n
    assert late_events <= 2 < prompt_events  # the first event, then everything else at once
