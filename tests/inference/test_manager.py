"""Loaded-model cache: load on first use, keep_alive, LRU eviction, leases, engine generation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.engines.base import (
    ContextLengthExceeded,
    QueueFull,
    SamplingParams,
    TokenEvent,
)
from conch.inference.models.store import ModelRecord, ModelStore
from conch.inference.serving.generation import generate
from conch.inference.serving.manager import ModelManager, ModelNotFound, parse_keep_alive


def test_parse_keep_alive() -> None:
    assert parse_keep_alive(None, 300) == 300
    assert parse_keep_alive(0, 300) == 0
    assert parse_keep_alive(-1, 300) == -1
    assert parse_keep_alive("10", 300) == 10
    assert parse_keep_alive("5m", 300) == 300
    assert parse_keep_alive("1h30m", 0) == 5400
    assert parse_keep_alive("250ms", 0) == 0.25
    with pytest.raises(ValueError):
        parse_keep_alive("soon", 300)


def _manager(settings: Settings, path: Path, ids: list[str]) -> ModelManager:
    store = ModelStore(settings)
    for mid in ids:
        store.register(ModelRecord(id=mid, path=str(path), capabilities=["chat", "embeddings"]))
    return ModelManager(settings, store)


def test_lru_eviction_and_keep_alive_zero(tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, max_loaded_models=1, n_ctx=256, n_parallel=1)
    manager = _manager(settings, smollm2_path, ["a", "b"])

    async def go() -> None:
        async with manager.use("a") as engine:
            assert engine.model_id == "a"
            assert manager.in_use("a")
        assert manager.loaded_ids() == ["a"] and not manager.in_use("a")
        async with manager.use("local:b"):
            pass
        assert manager.loaded_ids() == ["b"]  # "a" evicted: least recently used
        async with manager.use("b", keep_alive=0):
            pass
        assert manager.loaded_ids() == []
        with pytest.raises(ModelNotFound):
            async with manager.use("c"):
                pass
        await manager.unload_all()

    asyncio.run(go())


async def collect(manager: ModelManager, prompt: str, params: SamplingParams) -> list[TokenEvent]:
    return [ev async for ev in generate(manager, "m", prompt, params)]


def text(events: list[TokenEvent]) -> str:
    return "".join(ev.text for ev in events)


def test_engine_generates_and_limits(tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, n_ctx=128, n_parallel=1, max_queue=1)
    manager = _manager(settings, smollm2_path, ["m"])

    async def go() -> None:
        async with manager.use("m") as engine:
            prompt = engine.format_chat([{"role": "user", "content": "Hello"}])
            done = await collect(manager, prompt, SamplingParams(max_tokens=5, temperature=0))
            assert done[-1].n_tokens == 5 and done[-1].finish_reason == "length" and text(done)
            again = await collect(manager, prompt, SamplingParams(max_tokens=5, temperature=0))
            assert text(again) == text(done)
            with pytest.raises(ContextLengthExceeded):
                engine.generate("word " * 400, SamplingParams(max_tokens=1))
            first = engine.generate(prompt, SamplingParams(max_tokens=100, temperature=1))
            second = engine.generate(prompt, SamplingParams(max_tokens=100, temperature=1))
            with pytest.raises(QueueFull):
                engine.generate(prompt, SamplingParams(max_tokens=1))
                engine.generate(prompt, SamplingParams(max_tokens=1))
            first.cancel()
            second.cancel()
            vecs = engine.embed([engine.tokenize("a cat"), engine.tokenize("a cat"), engine.tokenize("tax law")])
            assert vecs[0] == pytest.approx(vecs[1], abs=1e-5)
            assert abs(sum(x * x for x in vecs[2]) - 1) < 1e-6
        await manager.unload_all()

    asyncio.run(go())
