"""The KV pool keeps few idle cells cached, and always the newest prefix for the next turn.

Cached prefixes scattered up llama.cpp's unified cache make attention span more cells for
every later request, so the pool drops the oldest idle prefixes beyond a budget (a quarter of
a context); the prefix just released always stays.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama import LlamaEngine


def test_idle_prefixes_stay_within_budget_and_the_newest_stays(smollm2_path: Path) -> None:
    engine = LlamaEngine("m", str(smollm2_path), n_ctx=512, n_parallel=4)
    engine.load()
    try:
        assert engine.scheduler is not None
        pool = engine.scheduler.pool
        assert pool.idle_budget == pool.kv_total // 8 == 128
        seen: list[int] = []

        async def go() -> None:
            # Prompts that share no prefix each take a sequence of their own.
            for word in ("Lighthouses", "Harbours", "Seagulls", "Storms", "Tides", "Anchors"):
                prompt = f"{word} at night are a subject of many old songs, and"
                async for _ in engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0)):
                    pass
                cached = {seq: len(tokens) for seq, tokens in pool.seq_cache.items() if tokens}
                newest = next(reversed(pool.seq_cache))
                # The prefix just released stays, whole: the next turn of its conversation
                # extends exactly these tokens.
                assert pool.seq_cache[newest][: len(engine.prompt_tokens(prompt))] == engine.prompt_tokens(prompt)
                # The others are kept only while all of them fit the budget.
                assert sum(cached.values()) <= max(pool.idle_budget, cached[newest])
                seen.append(len(cached))

        asyncio.run(go())
        # Without the budget, every one of the 4 sequences would hold a prefix by now.
        assert seen[-1] < 4
    finally:
        engine.unload()
