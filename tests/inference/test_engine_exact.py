"""With ``batch_invariant``, prompt-prefix reuse leaves every logit bitwise unchanged.

In that mode a reused prefix holds exactly the KV cache a fresh prefill would compute (at the
defaults, the same greedy tokens: test_prefix_reuse_tokens.py). The test hashes the full
logits row behind every sampled token and compares runs with and without reuse, with a shared
prefix longer than two micro-batches and reuse points inside micro-batches.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conch.inference.engines.llama.backend as backend
from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.engine import LlamaEngine
from conch.inference.engines.llama.offload import EXACT_UBATCH, RuntimeOptions, cpu_attention

# batch_invariant on the CPU: flash attention in micro-batches under 64 rows.
EXACT = RuntimeOptions(0, 0, "on", "f16", EXACT_UBATCH, 1024, False, batch_invariant=True)


def _address(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


class _HashingCalls:
    """The engine's fast llama.cpp calls, recording a hash of the logits before each sample."""

    def __init__(self, inner: Any, n_vocab: int) -> None:
        self._inner = inner
        self._n_vocab = n_vocab
        self.by_sampler: dict[int, list[str]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def llama_sampler_sample(self, sampler: Any, ctx: Any, idx: int) -> int:
        import llama_cpp

        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self._n_vocab,))
        self.by_sampler.setdefault(_address(sampler), []).append(hashlib.sha1(row.tobytes()).hexdigest())
        return int(self._inner.llama_sampler_sample(sampler, ctx, idx))


N_VOCAB = 49152  # SmolLM2


def _prompts() -> list[list[dict[str, str]]]:
    rnd = random.Random(3)
    words = ["the", "a", "lighthouse", "keeper", "sea", "storm", "ship", "night", "lamp", "old", "boat", "rope", "cliff", "gull", "wave", "fog"]
    system = " ".join(rnd.choice(words) for _ in range(150))  # > 2 micro-batches of shared prefix
    out = [[{"role": "system", "content": system}, {"role": "user", "content": " ".join(rnd.choice(words) for _ in range(n))}]
           for n in (1, 5, 40, 90)]
    out += [[{"role": "user", "content": f"Request {i}. Write a story."}] for i in range(3)]
    # Repeats reuse all but the last prompt token.
    return [*out, out[1], out[4]]


def _run(path: Path, *, cache_prompt: bool, monkeypatch: pytest.MonkeyPatch,
         runtime: RuntimeOptions = EXACT) -> list[list[str]]:
    engine = LlamaEngine("m", str(path), n_ctx=1024, n_parallel=4, cache_prompt=cache_prompt, runtime=runtime,
                         draft_max=0)
    # The worker thread binds the fast calls when it starts (in load).
    hashing = _HashingCalls(backend.fast_calls(), N_VOCAB)
    monkeypatch.setattr(backend, "_fast", hashing)
    engine.load()
    assert engine.scheduler is not None
    engine.scheduler.greedy_by_numpy = False  # every token through the chain, where the rows are read
    assert engine._model.n_vocab() == N_VOCAB
    samplers: dict[int, Any] = {}
    assert engine.scheduler is not None
    make_sampler = engine.scheduler.make_sampler

    def recording(params: SamplingParams) -> Any:
        sampler = make_sampler(params)
        samplers[id(params)] = sampler
        return sampler

    monkeypatch.setattr(engine.scheduler, "make_sampler", recording)

    async def one(messages: list[dict[str, str]]) -> list[str]:
        params = SamplingParams(max_tokens=12, temperature=0)
        async for _ in engine.generate(engine.format_chat(messages), params):
            pass
        # A freed sampler's address can come back for a later request: take its hashes now.
        return hashing.by_sampler.pop(_address(samplers.pop(id(params))))

    async def go() -> list[list[str]]:
        return [await one(messages) for messages in _prompts()]

    try:
        return asyncio.run(go())
    finally:
        engine.unload()


def test_prefix_reuse_is_bitwise_exact(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _run(smollm2_path, cache_prompt=False, monkeypatch=monkeypatch)
    reused = _run(smollm2_path, cache_prompt=True, monkeypatch=monkeypatch)
    assert all(fresh) and sum(map(len, fresh)) > 50
    assert reused == fresh



def test_prefix_reuse_is_exact_without_flash_attention_too(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``flash_attn = "off"`` on the CPU, in llama-server's micro-batches of 512: plain
    attention's rows do not depend on how they were batched either."""
    fa, ubatch = cpu_attention("off")
    assert (fa, ubatch) == ("off", 512)
    off = RuntimeOptions(0, 0, fa, "f16", ubatch, 1024, False)
    fresh = _run(smollm2_path, cache_prompt=False, monkeypatch=monkeypatch, runtime=off)
    reused = _run(smollm2_path, cache_prompt=True, monkeypatch=monkeypatch, runtime=off)
    assert all(fresh) and sum(map(len, fresh)) > 50
    assert reused == fresh
