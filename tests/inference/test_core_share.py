"""The CPU cores shared among the models generating at once (device.CoreShare): two models
busy together each decode on their share of the cores, a model alone gets them all back once
the other has been idle for the hold, and threads set by hand are kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.device import CPU_CORES, CoreShare

# -- the share itself ---------------------------------------------------------------------------


def test_one_busy_model_gets_what_it_asks() -> None:
    share = CoreShare(8, hold_s=60)
    a, b, c = object(), object(), object()
    assert share.threads(8) == 8
    share.enter(a)
    assert share.threads(8) == 8 and share.threads(3) == 3
    share.enter(b)
    assert share.threads(8) == 4 and share.threads(3) == 3  # never more than it asked
    share.enter(c)
    assert share.threads(8) == 2  # 8 // 3
    share.leave(c, gone=True)  # unloaded: counts no more at once
    assert share.threads(8) == 4


def test_an_idle_model_counts_for_the_hold_then_not() -> None:
    share = CoreShare(2, hold_s=0.2)
    a, b = object(), object()
    share.enter(a)
    share.enter(b)
    assert share.threads(2) == 1
    share.leave(b)  # between two requests of a steady load: still counted
    assert share.threads(2) == 1
    time.sleep(0.25)
    assert share.threads(2) == 2
    share.enter(b)
    assert share.threads(2) == 1


def test_a_share_is_at_least_one_thread() -> None:
    share = CoreShare(2, hold_s=60)
    for who in [object() for _ in range(5)]:
        share.enter(who)
    assert share.threads(2) == 1


# -- on real engines ----------------------------------------------------------------------------

LONG = SamplingParams(max_tokens=96, temperature=0.0)


async def _threads_while_generating(engine: le.LlamaEngine, seen: list[Any], start: asyncio.Event) -> None:
    await start.wait()
    async for _ in engine.generate("Once upon a time, in a small village by the sea,", LONG):
        seen.append(engine.scheduler.threads_now)


@pytest.fixture(scope="module")
def two(smollm2_path: Path) -> Any:
    a = le.LlamaEngine("share-a", str(smollm2_path), n_ctx=512, n_parallel=1)
    b = le.LlamaEngine("share-b", str(smollm2_path), n_ctx=512, n_parallel=1)
    a.load()
    b.load()
    yield a, b
    a.unload()
    b.unload()


def test_two_models_generating_at_once_share_the_cores(two: Any) -> None:
    a, b = two
    full = (a.n_threads, a.n_threads_batch)
    half = tuple(max(1, min(n, CPU_CORES.cores // 2)) for n in full)
    seen_a: list[Any] = []
    seen_b: list[Any] = []

    async def both() -> None:
        start = asyncio.Event()
        tasks = [asyncio.create_task(_threads_while_generating(a, seen_a, start)),
                 asyncio.create_task(_threads_while_generating(b, seen_b, start))]
        start.set()
        await asyncio.gather(*tasks)

    asyncio.run(both())
    # Once both are under way, each runs on its share (the first steps may precede the other).
    assert seen_a[-1] == half and seen_b[-1] == half, (seen_a, seen_b)
    # Alone again after the other's hold: all of them.
    time.sleep(CPU_CORES.hold_s + 0.2)
    alone: list[Any] = []

    async def one() -> None:
        start = asyncio.Event()
        start.set()
        await _threads_while_generating(a, alone, start)

    asyncio.run(one())
    assert alone and alone[-1] == full, alone


def test_threads_set_by_hand_are_kept(smollm2_path: Path) -> None:
    engine = le.LlamaEngine("share-hand", str(smollm2_path), n_ctx=512, n_parallel=1, n_threads=1)
    engine.load()
    try:
        assert engine.scheduler.threads is None and engine.scheduler.threads_now is None
    finally:
        engine.unload()
