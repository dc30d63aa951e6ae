"""The models' memory budget, with real models and real llama.cpp loads: footprints estimated
from the GGUF against what llama.cpp allocated, eviction of idle models least recently used
first (never a busy one), waiting for memory, ``insufficient_memory``, several models serving
at once, and per-model load settings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conch import db
from conch.config import Settings
from conch.errors import Conflict
from conch.inference.engines.base import SamplingParams
from conch.inference.models.store import ModelStore
from conch.inference.serving.generation import generate
from conch.inference.serving.manager import InsufficientMemory, ModelManager
from tests.inference.budget_models import MINILM, SMOL, TINY, make_models, register

MiB = 1 << 20


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    return make_models(tmp_path_factory.mktemp("budget-models"), smollm2_path)


@pytest.fixture()
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"
    db.dispose_all()


def manager(data_dir: Path, models: dict[str, Path], **settings: object) -> ModelManager:
    s = Settings(data_dir=data_dir, **{"n_ctx": 512, "n_parallel": 2, **settings})  # type: ignore[arg-type]
    store = ModelStore(s)
    register(store, models)
    return ModelManager(s, store)


def estimates(data_dir: Path, models: dict[str, Path], **settings: object) -> dict[str, int]:
    """Each model's estimated footprint under these settings (nothing loaded)."""
    m = manager(data_dir, models, **settings)
    return {mid: m.estimate(m.record_for(mid)).footprint.total_bytes for mid in models}


def budget_mb(n_bytes: int) -> int:
    return -(-n_bytes // MiB)


async def load(m: ModelManager, model_id: str) -> None:
    async with m.use(model_id):
        pass


def test_estimates_are_within_ten_percent_of_what_llama_cpp_allocates(data_dir: Path,
                                                                        models: dict[str, Path]) -> None:
    async def go(m: ModelManager) -> dict[str, tuple[int, int]]:
        out = {}
        for mid in (SMOL, TINY, MINILM):
            async with m.use(mid) as engine:
                if mid == MINILM:
                    # An encoder's context opens with its first input; its estimate counts it.
                    await m.run(mid, engine.embed, [engine.tokenize("a cat sat on the mat")])
            entry = m.loaded(mid)
            assert entry is not None and entry.measured_bytes is not None
            est = entry.estimate.footprint
            out[mid] = (est.total_bytes, entry.measured_bytes)
            kinds = entry.measured.by_kind or {}
            # Weights and the KV cache are what llama.cpp's formula gives, to the byte (MiB-rounded log).
            assert abs(kinds.get("model", 0) - est.weights_bytes) < 0.01 * MiB, (mid, kinds)
            assert abs(kinds.get("kv", 0) - est.kv_bytes) < 0.01 * MiB, (mid, kinds)
        await m.unload_all()
        return out

    m = manager(data_dir, models, memory_budget_mb=4096)
    for mid, (est, measured) in asyncio.run(go(m)).items():
        assert abs(est - measured) <= 0.10 * measured, f"{mid}: estimated {est / MiB:.1f} MiB, measured {measured / MiB:.1f} MiB"
    # Plain attention in 512-token micro-batches: the attention scores join the compute buffers.
    m = manager(data_dir, models, memory_budget_mb=4096, flash_attn="off", n_ctx=2048)
    for mid, (est, measured) in asyncio.run(go(m)).items():
        assert abs(est - measured) <= 0.10 * measured, f"{mid} (flash_attn off): {est / MiB:.1f} vs {measured / MiB:.1f} MiB"


def test_a_chat_model_embedding_context_adds_to_its_measured_footprint(data_dir: Path,
                                                                        models: dict[str, Path]) -> None:
    m = manager(data_dir, models, memory_budget_mb=4096)

    async def go() -> None:
        async with m.use(SMOL) as engine:
            entry = m.loaded(SMOL)
            assert entry is not None
            at_load = entry.measured_bytes
            assert at_load is not None
            await m.run(SMOL, engine.embed, [engine.tokenize("hello")])
            grown = entry.measured_bytes
            assert grown is not None and grown > at_load + 10 * MiB  # its KV cache and compute buffers
            assert m.used_bytes() == grown
        await m.unload_all()
        # Loaded again with the same settings, it is counted at what it took, not at its estimate.
        record = m.record_for(SMOL)
        assert m.known_bytes(record, m.estimate(record)) == grown

    asyncio.run(go())


def test_loading_evicts_the_least_recently_used_idle_model_to_fit(data_dir: Path, models: dict[str, Path]) -> None:
    est = estimates(data_dir, models)
    # SmolLM2 fits beside either of the others, never beside both.
    budget = budget_mb(est[SMOL] + max(est[MINILM], est[TINY]) + 4 * MiB)
    assert budget * MiB < est[SMOL] + est[MINILM] + est[TINY]
    m = manager(data_dir, models, memory_budget_mb=budget, max_loaded_models=3)

    async def go() -> None:
        await load(m, TINY)
        await load(m, MINILM)
        await load(m, SMOL)
        assert m.loaded_ids() == [MINILM, SMOL] and m.evictions == 1  # TINY: least recently used

        await load(m, TINY)  # MINILM is now the least recently used
        assert m.loaded_ids() == [SMOL, TINY]
        await load(m, SMOL)  # used again: TINY becomes the one to go
        await load(m, MINILM)
        assert m.loaded_ids() == [SMOL, MINILM] and m.used_bytes() <= budget * MiB
        await m.unload_all()

    asyncio.run(go())


def test_a_busy_model_is_never_evicted(data_dir: Path, models: dict[str, Path]) -> None:
    est = estimates(data_dir, models)
    budget = budget_mb(est[SMOL] + max(est[MINILM], est[TINY]) + 4 * MiB)
    m = manager(data_dir, models, memory_budget_mb=budget, max_loaded_models=3)

    async def go() -> None:
        await load(m, MINILM)
        await load(m, TINY)
        # MINILM is the least recently used, but a request holds it: TINY goes instead.
        async with m.use(MINILM):
            await load(m, SMOL)
            assert set(m.loaded_ids()) == {MINILM, SMOL}
            assert m.in_use(MINILM)
        await m.unload_all()

    asyncio.run(go())


def test_a_request_that_does_not_fit_waits_for_memory_then_loads(data_dir: Path, models: dict[str, Path]) -> None:
    est = estimates(data_dir, models)
    budget = budget_mb(est[SMOL] + est[TINY] // 2)  # SmolLM2 or the tiny model, never both
    m = manager(data_dir, models, memory_budget_mb=budget, memory_wait_s=60)

    async def go() -> None:
        # A real generation keeps the tiny model busy while SmolLM2 is asked for.
        held = asyncio.Event()

        async def tiny_request() -> int:
            n = 0
            # The end-of-text tokens banned: the random model runs to max_tokens.
            params = SamplingParams(max_tokens=48, temperature=0, logit_bias={0: -100, 1: -100, 2: -100})
            async for ev in generate(m, TINY, "Once upon a time", params):
                held.set()
                n = ev.n_tokens or n
            return n

        task = asyncio.create_task(tiny_request())
        await held.wait()
        async with m.use(SMOL) as engine:
            # It loaded only once the tiny model's request was over, by unloading it.
            assert engine.model_id == SMOL and m.loaded(TINY) is None
        assert await task == 48
        assert m.loaded_ids() == [SMOL] and m.evictions == 1
        await m.unload_all()

    asyncio.run(go())


def test_insufficient_memory_after_the_wait_names_what_was_needed_and_free(data_dir: Path,
                                                                           models: dict[str, Path]) -> None:
    est = estimates(data_dir, models)
    budget = budget_mb(est[SMOL] + est[TINY] // 2)
    m = manager(data_dir, models, memory_budget_mb=budget, memory_wait_s=0.5)

    async def go() -> None:
        async with m.use(TINY):
            t0 = time.monotonic()
            with pytest.raises(InsufficientMemory) as info:
                await load(m, SMOL)
            assert time.monotonic() - t0 >= 0.5
            err = info.value
            assert (err.status, err.code, err.where) == (503, "insufficient_memory", "model")
            assert err.needed_bytes == est[SMOL] and err.budget_bytes == budget * MiB
            tiny_bytes = m.loaded(TINY).bytes  # type: ignore[union-attr]
            assert err.free_bytes == budget * MiB - tiny_bytes
            assert f"{(est[SMOL] + MiB // 2) // MiB:,} MB" in err.message and "tiny" in err.message
            assert "memory_wait_s" in err.message
            assert m.loaded_ids() == [TINY]  # the busy model untouched
        await load(m, SMOL)  # once idle, it makes room
        assert m.loaded_ids() == [SMOL]
        await m.unload_all()

    asyncio.run(go())


def test_a_model_larger_than_the_budget_is_refused_at_once(data_dir: Path, models: dict[str, Path]) -> None:
    est = estimates(data_dir, models)
    m = manager(data_dir, models, memory_budget_mb=budget_mb(est[SMOL]) - 1, memory_wait_s=30)

    async def go() -> None:
        t0 = time.monotonic()
        with pytest.raises(InsufficientMemory) as info:
            await load(m, SMOL)
        assert time.monotonic() - t0 < 5  # no point waiting: nothing could free enough
        assert "memory_budget_mb" in info.value.message and "n_ctx" in info.value.message
        await load(m, TINY)  # the others still load
        await m.unload_all()

    asyncio.run(go())


def test_two_models_serve_requests_at_the_same_time(data_dir: Path, models: dict[str, Path]) -> None:
    m = manager(data_dir, models, memory_budget_mb=4096)

    async def stream(model_id: str, seen: list[str]) -> int:
        n = 0
        async for ev in generate(m, model_id, "Tell me a story", SamplingParams(max_tokens=24, temperature=0)):
            seen.append(model_id)
            n = ev.n_tokens or n
        return n

    async def go() -> None:
        seen: list[str] = []
        a, b = await asyncio.gather(stream(SMOL, seen), stream(TINY, seen))
        assert a > 0 and b > 0
        # Interleaved: neither model waited for the other to finish.
        first_tiny, last_smol = seen.index(TINY), len(seen) - 1 - seen[::-1].index(SMOL)
        assert first_tiny < last_smol
        assert set(m.loaded_ids()) == {SMOL, TINY}
        await m.unload_all()

    asyncio.run(go())


def test_load_with_overrides_reloads_with_them_and_refuses_while_busy(data_dir: Path,
                                                                       models: dict[str, Path]) -> None:
    m = manager(data_dir, models, memory_budget_mb=4096)

    async def go() -> None:
        entry = await m.load(TINY, {"n_ctx": 256, "n_threads": 1})
        assert entry.engine.n_ctx == 256 and entry.engine.n_threads == 1  # type: ignore[attr-defined]
        assert entry.estimate.plan is not None and entry.estimate.plan.kv_cells == 256  # one pool of n_ctx cells, every sequence sharing it
        assert m.settings.model_overrides[TINY].n_ctx == 256
        small = entry.bytes
        loads = m.loads
        assert (await m.load(TINY, {})).engine is entry.engine and m.loads == loads  # same settings: kept
        bigger = await m.load(TINY, {"n_ctx": 4096})
        assert m.loads == loads + 1 and bigger.engine.n_ctx == 4096  # type: ignore[attr-defined]
        assert bigger.estimate.footprint.kv_bytes == 16 * entry.estimate.footprint.kv_bytes
        assert bigger.bytes > small and bigger.engine.n_threads == 1  # type: ignore[attr-defined]
        async with m.use(TINY):
            with pytest.raises(Conflict) as info:
                await m.load(TINY, {"n_ctx": 512})
            assert info.value.code == "model_in_use"
        assert m.settings.model_overrides[TINY].n_ctx == 4096  # the refused change was not kept
        # null: back to the server's setting.
        back = await m.load(TINY, {"n_ctx": None, "n_threads": None})
        assert back.engine.n_ctx == 512 and TINY not in m.settings.model_overrides  # type: ignore[attr-defined]
        await m.unload_all()

    asyncio.run(go())
