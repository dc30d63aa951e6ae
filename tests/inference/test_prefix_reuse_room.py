"""A prompt reusing an idle prefix is admitted without evicting that prefix.

The pool holds ``n_ctx`` cells for every sequence together, so a prompt longer than half the
pool, cached after it was served, leaves less free room than the next prompt sharing it needs.
The idle sequence a request takes over is room for it (its cells are reused or removed): the
same long prompt again, or a chat's next turn, must reuse the cells in memory instead of
prefilling everything again. Real engines on the bundled SmolLM2; ``stats.prefill_tokens``
counts the prompt tokens actually decoded.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.engine import LlamaEngine

WORDS = ["the", "a", "lighthouse", "keeper", "sea", "storm", "ship", "night", "lamp", "old", "boat", "rope"]


def _words(seed: int, n: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def _serve(engine: LlamaEngine, messages: list[dict[str, str]]) -> str:
    async def go() -> str:
        text = ""
        async for ev in engine.generate(engine.format_chat(messages), SamplingParams(max_tokens=8, temperature=0)):
            assert ev.error is None
            text += ev.text
        return text

    return asyncio.run(go())


def test_a_long_prefix_is_reused_in_a_pool_it_more_than_half_fills(smollm2_path: Path) -> None:
    engine = LlamaEngine("m", str(smollm2_path), n_ctx=1024, n_parallel=2, draft_max=0)
    engine.load()
    try:
        chat = [{"role": "system", "content": _words(1, 620)}, {"role": "user", "content": "Who keeps the lamp?"}]
        n_prompt = len(engine.prompt_tokens(engine.format_chat(chat)))
        assert 600 < n_prompt < 1024 - 300
        first = _serve(engine, chat)
        assert engine.stats.prefill_tokens == n_prompt
        # The same prompt again: all but its last token from memory.
        assert _serve(engine, chat) == first
        assert engine.stats.prefill_tokens - n_prompt <= 2
        # The next turn of the chat: only what is new is prefilled.
        before = engine.stats.prefill_tokens
        chat += [{"role": "assistant", "content": first}, {"role": "user", "content": "And the ship?"}]
        n_next = len(engine.prompt_tokens(engine.format_chat(chat)))
        _serve(engine, chat)
        assert engine.stats.prefill_tokens - before < n_next - n_prompt + 8
    finally:
        engine.unload()
