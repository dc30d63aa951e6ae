"""llama.cpp's OpenMP threads: only a thread that is decoding keeps a pool of them.

libgomp keeps worker threads for every thread that ever computed, and once the pools together
exceed the CPUs its barriers stop spinning: decoding then ran 6x slower on a 16-core machine
(docs/inference.md, "Threads"). These tests count the process's threads around a load, a
generation and an embedding on the real engine.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

import conch.inference.engines.llama.engine as le
from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.backend import _find_omp_pause, init_backend

init_backend()
pytestmark = pytest.mark.skipif(_find_omp_pause() is None, reason="llama.cpp here does not run on OpenMP")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settles_at(expected: int, timeout: float = 5.0) -> int:
    end = time.monotonic() + timeout
    while _threads() != expected and time.monotonic() < end:
        time.sleep(0.02)
    return _threads()


def test_only_the_decoding_thread_keeps_openmp_threads(smollm2_path: Path) -> None:
    before = _threads()
    engine = le.LlamaEngine("m", str(smollm2_path), n_ctx=512, n_parallel=2, n_threads=3)
    loader = threading.Thread(target=engine.load)  # as the server loads: on another thread
    loader.start()
    loader.join()
    try:
        assert engine.scheduler is not None
        assert _settles_at(before + 1) == before + 1  # the decode worker, and no loader pool

        async def generate() -> int:
            n = 0
            async for ev in engine.generate("Once upon a time", SamplingParams(max_tokens=8, temperature=0.0)):
                n = ev.n_tokens
            return n

        assert asyncio.run(generate()) > 0
        # Idle again: the worker gave its two OpenMP threads back.
        assert _settles_at(before + 1) == before + 1

        # An embedding on a thread that lives on (an executor's): that thread keeps no pool.
        embedded, finish = threading.Event(), threading.Event()

        def embed_and_linger() -> None:
            engine.embed([[1, 2, 3, 4, 5, 6, 7, 8]])
            embedded.set()
            finish.wait(10)

        embedder = threading.Thread(target=embed_and_linger)
        embedder.start()
        try:
            assert embedded.wait(60)
            assert _settles_at(before + 2) == before + 2  # the worker and the embedding thread
        finally:
            finish.set()
            embedder.join()
    finally:
        engine.unload()
