"""At the defaults a reused prompt prefix gives the greedy tokens a fresh prefill gives.

By default a prompt is prefilled in llama-server's micro-batches of 512 rows, whose flash
attention rounds by how the prompt was split and where its cells sit: a reused prefix (a shared
system prompt, the earlier turns of a chat with the model's own answers, the same prompt again)
holds what a fresh prefill computes up to the last bits, not bit for bit (``batch_invariant``
gives bits: test_engine_exact.py). What must hold is what a user sees: the same greedy answer,
token for token, whether the prefix was reused or computed afresh. The corpus: prefixes longer
than one micro-batch, reuse points inside and at the edge of micro-batches, multi-turn chats
reusing generated tokens, repeats, answers of a hundred tokens and more.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.engine import LlamaEngine
from conch.inference.engines.llama.offload import CPU_UBATCH

WORDS = ["the", "a", "lighthouse", "keeper", "sea", "storm", "ship", "night", "lamp", "old", "boat", "rope",
         "cliff", "gull", "wave", "fog", "harbour", "signal", "tide", "north"]
Conversation = list[dict[str, str]]


def _words(seed: int, n: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


SYSTEM = "You are the archivist of a coastal town. Answer from these notes. " + _words(1, 620)
QUESTIONS = ["What did the keeper see in the fog?", "Tell me about the storm.", "Which ship came back?",
             "Write a short poem about the lamp."]


def _generate(engine: LlamaEngine, messages: Conversation, max_tokens: int) -> list[int]:
    async def go() -> list[int]:
        tokens: list[int] = []
        params = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=0)
        async for ev in engine.generate(engine.format_chat(messages), params):
            assert ev.error is None
            tokens += [lp.token for lp in ev.logprobs or []]
        return tokens

    return asyncio.run(go())


def _session(engine: LlamaEngine) -> list[list[int]]:
    """The corpus, in an order where every request after the first can reuse a prefix."""
    out: list[list[int]] = []
    # A shared system prompt (over one micro-batch) with different questions.
    for q in QUESTIONS:
        out.append(_generate(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], 96))
    # The same prompt again: all but its last token reused.
    out.append(_generate(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}], 96))
    # A chat: each turn reuses the earlier turns, the model's own answers included.
    chat: Conversation = [{"role": "system", "content": SYSTEM}]
    for turn, q in enumerate(["Who keeps the lighthouse?", "And what does the keeper do at night?",
                              "Summarize what you said."]):
        chat.append({"role": "user", "content": q})
        answer = _generate(engine, chat, 128 if turn < 2 else 160)
        out.append(answer)
        chat.append({"role": "assistant", "content": engine.detokenize(answer)})
    # Prompts of every length near the micro-batch's edge (reuse ending inside and at its end).
    for extra in (1, 30, 63, 64, 100):
        out.append(_generate(engine, [{"role": "user", "content": _words(9, 470 + extra)}], 48))
    return out


@pytest.mark.timeout(1800)
def test_reused_prefixes_give_the_tokens_of_a_fresh_prefill(smollm2_path: Path) -> None:
    results = []
    for cache_prompt in (False, True):
        engine = LlamaEngine("m", str(smollm2_path), n_ctx=4096, n_parallel=2, cache_prompt=cache_prompt,
                             draft_max=0)
        engine.load()
        try:
            assert engine.n_ubatch == CPU_UBATCH  # the default: llama-server's micro-batches
            results.append(_session(engine))
        finally:
            engine.unload()
    fresh, reused = results
    assert sum(map(len, fresh)) > 800
    for i, (a, b) in enumerate(zip(fresh, reused, strict=True)):
        split = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert a == b, f"request {i}: the reused prefix changed the answer from token {split} on"
