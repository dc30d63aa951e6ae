"""llama.cpp's OpenMP threads: only a thread that is decoding keeps a pool of them.

libgomp keeps worker threads for every thread that ever computed, and once the pools together
exceed the CPUs its barriers stop spinning: decoding then ran 6x slower on a 16-core machine
(docs/inference.md, "OpenMP pools"). The check counts a fresh process's threads around a load,
a generation and an embedding on the real engine (a fresh process: other tests' engines and
executors would move the count).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conch.inference.engines.llama.backend import _find_omp_pause, init_backend

init_backend()
pytestmark = pytest.mark.skipif(_find_omp_pause() is None, reason="llama.cpp here does not run on OpenMP")

SRC = Path(__file__).resolve().parents[2] / "src"
SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys, threading, time
    import conch.inference.engines.llama.engine as le
    from conch.inference.engines.base import SamplingParams

    def threads():
        return len(os.listdir("/proc/self/task"))

    def settle(expected, timeout=10.0):
        end = time.monotonic() + timeout
        while threads() != expected and time.monotonic() < end:
            time.sleep(0.02)
        return threads()

    before = threads()
    engine = le.LlamaEngine("m", sys.argv[1], n_ctx=512, n_parallel=2, n_threads=3)
    loader = threading.Thread(target=engine.load)  # as the server loads: on another thread
    loader.start(); loader.join()
    out = {"before": before, "loaded": settle(before + 1)}

    async def generate():
        n = 0
        async for ev in engine.generate("Once upon a time", SamplingParams(max_tokens=8, temperature=0.0)):
            n = ev.n_tokens
        return n

    out["tokens"] = asyncio.run(generate())
    out["idle"] = settle(before + 1)
    embedded, finish = threading.Event(), threading.Event()

    def embed_and_linger():  # an executor's thread lives on after its job
        engine.embed([[1, 2, 3, 4, 5, 6, 7, 8]])
        embedded.set()
        finish.wait(20)

    t = threading.Thread(target=embed_and_linger); t.start()
    embedded.wait(60)
    out["embedding_thread_alive"] = settle(before + 2)
    finish.set(); t.join()
    engine.unload()
    print(json.dumps(out))
""")


def test_only_the_decoding_thread_keeps_openmp_threads(smollm2_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm2_path)], capture_output=True, text=True,
                         env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    before = out["before"]
    assert out["loaded"] == before + 1  # the decode worker, and no pool left by the loader
    assert out["tokens"] > 0
    assert out["idle"] == before + 1  # the idle worker gave its OpenMP threads back
    assert out["embedding_thread_alive"] == before + 2  # that thread kept no pool either
