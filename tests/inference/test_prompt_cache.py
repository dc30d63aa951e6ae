"""The prompt cache on disk: long prefixes survive a restart and never change an output.

Real engines on the bundled SmolLM2: a new ``LlamaEngine`` on the same directory stands for a
restarted server. Outputs are greedy, and compared together with the log-probabilities behind
every token, so a restored prefix that differed in the last bits would show.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from conch.config import Settings
from conch.inference.engines.base import SamplingParams
from conch.inference.engines.llama.engine import LlamaEngine
from conch.inference.engines.llama.offload import EXACT_UBATCH, RuntimeOptions
from conch.inference.engines.llama.prompt_cache import common_prefix
from conch.inference.engines.load import load_engine
from conch.inference.models.store import ModelRecord

LOGGER = "conch.inference.engines.llama.prompt_cache"
WORDS = ["the", "a", "lighthouse", "keeper", "sea", "storm", "ship", "night", "lamp", "old", "boat", "rope",
         "cliff", "gull", "wave", "fog", "harbour", "signal", "tide", "north"]


def _system(seed: int, n_words: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def _messages(system: str, user: str = "Tell me what the keeper saw.") -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _engine(path: Path, cache_dir: Path | None, *, n_ctx: int = 2048, max_bytes: int = 1 << 30) -> LlamaEngine:
    # batch_invariant: a restored prefix is then bitwise what a prefill computes (the compared
    # log-probabilities would show the last bits); at the defaults, the same greedy tokens.
    engine = LlamaEngine("smollm2", str(path), n_ctx=n_ctx, n_parallel=2, prompt_cache_dir=cache_dir,
                         prompt_cache_max_bytes=max_bytes, draft_max=0, runtime=EXACT)
    engine.load()
    return engine


Output = tuple[str, list[Any]]


def _serve(engine: LlamaEngine, messages: list[dict[str, str]], max_tokens: int = 16) -> Output:
    async def go() -> Output:
        text, logprobs = "", []
        params = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=3)
        async for ev in engine.generate(engine.format_chat(messages), params):
            assert ev.error is None
            text += ev.text
            logprobs += [(lp.token, lp.logprob, lp.top) for lp in ev.logprobs or []]
        return text, logprobs

    return asyncio.run(go())


def _once(path: Path, cache_dir: Path | None, messages: list[dict[str, str]], **kw: Any) -> tuple[Output, LlamaEngine]:
    """Serve ``messages`` on an engine started for it, then stop the engine (a server's life)."""
    engine = _engine(path, cache_dir, **kw)
    try:
        return _serve(engine, messages), engine
    finally:
        engine.unload()


def _files(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*.kv"))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


EXACT = RuntimeOptions(0, 0, "on", "f16", EXACT_UBATCH, 2048, False, batch_invariant=True)
MEDIUM = _messages(_system(7, 330))  # ~350 prompt tokens: over the default 256


@pytest.fixture(scope="module")
def medium_reference(smollm2_path: Path) -> Output:
    """MEDIUM served with the disk cache off."""
    return _once(smollm2_path, None, MEDIUM)[0]


@pytest.mark.timeout(900)
def test_long_system_prompt_is_restored_after_a_restart(smollm2_path: Path, tmp_path: Path) -> None:
    messages = _messages(_system(1, 1480))
    cache = tmp_path / "kv-cache"
    reference = _once(smollm2_path, None, messages)[0]
    first, engine = _once(smollm2_path, cache, messages)
    assert first == reference
    assert engine.stats.prompt_cache_restored_tokens == 0
    [saved] = _files(cache)
    assert engine.stats.prompt_cache_saved_tokens >= 1500

    # "Restarted": a new engine on the same directory loads the prefix instead of prefilling it.
    engine = _engine(smollm2_path, cache)
    try:
        n_prompt = len(engine.prompt_tokens(engine.format_chat(messages)))
        assert 1500 <= n_prompt < 1900
        assert engine.scheduler is not None
        # All but the last token or two (the re-decoded tail ends as a fresh prefill ends).
        restored = engine.scheduler.pool.fit_keep(n_prompt, n_prompt - 1)
        assert restored >= n_prompt - 2
        assert _serve(engine, messages) == reference
        assert engine.stats.prompt_cache_restored_tokens == restored
        # The same prompt again: from memory, not from disk.
        assert _serve(engine, messages) == reference
        assert engine.stats.prompt_cache_restored_tokens == restored
    finally:
        engine.unload()
    assert _files(cache) == [saved]  # already saved: not written again


@pytest.mark.timeout(900)
def test_a_restore_beside_an_idle_prefix_gives_the_cold_output(smollm2_path: Path, tmp_path: Path) -> None:
    """A short chat served first stays in the pool as an idle prefix sharing a few tokens with
    the long prompt. A prefill of the long prompt takes that sequence and writes over it from
    those tokens on; the restore must land there too, not in another sequence after the short
    chat's cells (single-row decode steps over 512 cells and more depend on where the cells
    sit: the answer changed)."""
    messages = _messages(_system(1, 1480))
    hello = [{"role": "user", "content": "Hello"}]
    cache = tmp_path / "kv-cache"
    reference = _once(smollm2_path, None, messages)[0]
    for restart in (False, True):
        engine = _engine(smollm2_path, cache)
        try:
            _serve(engine, hello)
            assert _serve(engine, messages) == reference
            assert (engine.stats.prompt_cache_restored_tokens > 1000) is restart
        finally:
            engine.unload()


def test_a_saved_prefix_serves_another_question(smollm2_path: Path, tmp_path: Path) -> None:
    """The entry holds the system prompt, a question and its answer; a new question shares
    only the system prompt, so the restored cells are cut back to it."""
    cache = tmp_path / "kv-cache"
    other = _messages(MEDIUM[0]["content"], "Where did the ship go?")
    reference = _once(smollm2_path, None, other)[0]
    _once(smollm2_path, cache, MEDIUM)
    engine = _engine(smollm2_path, cache)
    try:
        assert _serve(engine, other) == reference
        shared = common_prefix(engine.prompt_tokens(engine.format_chat(MEDIUM)),
                               engine.prompt_tokens(engine.format_chat(other)))
        assert shared > 300
        assert engine.scheduler is not None
        assert engine.stats.prompt_cache_restored_tokens == engine.scheduler.pool.fit_keep(
            len(engine.prompt_tokens(engine.format_chat(other))), shared)
    finally:
        engine.unload()


def test_corrupt_and_truncated_files_are_ignored(
    smollm2_path: Path, tmp_path: Path, medium_reference: Output, caplog: pytest.LogCaptureFixture,
) -> None:
    cache = tmp_path / "kv-cache"
    assert _once(smollm2_path, cache, MEDIUM)[0] == medium_reference
    [path] = _files(cache)
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[-5000:-4000] = os.urandom(1000)  # inside the KV state: only the checksum can tell
    cases = {
        "truncated": good[: len(good) // 2],
        "state bytes changed": bytes(flipped),
        "garbage": os.urandom(4096),
        "empty": b"",
    }
    for case, data in cases.items():
        path.write_bytes(data)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            output, engine = _once(smollm2_path, cache, MEDIUM)
        assert output == medium_reference, case
        assert engine.stats.prompt_cache_restored_tokens == 0, case
        [line] = _warnings(caplog)
        assert path.name in line and "ignoring and deleting" in line, case
        # The request saved its prefix again, whole.
        assert path.read_bytes() == good, case
    output, engine = _once(smollm2_path, cache, MEDIUM)
    assert output == medium_reference
    assert engine.stats.prompt_cache_restored_tokens > 300


@pytest.mark.parametrize("foreign", ["n_ctx", "model"])
def test_a_foreign_file_is_ignored(
    smollm2_path: Path, tmp_path: Path, medium_reference: Output, caplog: pytest.LogCaptureFixture, foreign: str,
) -> None:
    """A state saved for another context size, or another model file, put where this engine
    looks: ignored with one line, deleted, the output unchanged."""
    other_dir = tmp_path / "other"
    if foreign == "n_ctx":
        _once(smollm2_path, other_dir, MEDIUM, n_ctx=1024)
    else:
        copy = tmp_path / "copy.gguf"  # another file: another model as far as the cache knows
        shutil.copy(smollm2_path, copy)
        _once(copy, other_dir, MEDIUM)
    [saved] = _files(other_dir)

    cache = tmp_path / "kv-cache"
    engine = _engine(smollm2_path, cache)
    assert engine.prompt_cache is not None
    home = engine.prompt_cache.dir
    engine.unload()
    home.mkdir(parents=True)
    planted = home / saved.name
    shutil.copy(saved, planted)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        output, engine = _once(smollm2_path, cache, MEDIUM)
    assert output == medium_reference
    assert engine.stats.prompt_cache_restored_tokens == 0
    [line] = _warnings(caplog)
    assert planted.name in line and "another model or context" in line
    # Deleted; what is there now is this engine's own save.
    assert planted.exists() and planted.read_bytes() != saved.read_bytes()


def test_the_size_bound_deletes_the_least_recently_used(smollm2_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "kv-cache"
    prompts = [_messages(_system(seed, 300)) for seed in (11, 12, 13)]
    engine = _engine(smollm2_path, cache)
    try:
        _serve(engine, prompts[0])
        _serve(engine, prompts[1])
    finally:
        engine.unload()
    sizes = [p.stat().st_size for p in _files(cache)]
    assert len(sizes) == 2
    bound = sum(sizes) + min(sizes) // 2  # two entries fit, three do not

    engine = _engine(smollm2_path, cache, max_bytes=bound)
    try:
        _serve(engine, prompts[0])  # restored: the first entry is now the most recently used
        assert engine.stats.prompt_cache_restored_tokens > 256
        _serve(engine, prompts[2])  # a third entry: the second, least recently used, goes
        assert engine.prompt_cache is not None
        engine.prompt_cache.flush()
    finally:
        engine.unload()
    assert len(_files(cache)) == 2
    assert sum(p.stat().st_size for p in _files(cache)) <= bound

    engine = _engine(smollm2_path, cache, max_bytes=bound)
    try:
        assert engine.prompt_cache is not None
        covered = [engine.prompt_cache.lookup(engine.prompt_tokens(engine.format_chat(m)))[1] for m in prompts]
    finally:
        engine.unload()
    assert covered[0] > 256 and covered[2] > 256
    assert covered[1] < 20  # only the template's first tokens


def test_settings_put_the_cache_under_the_data_dir(smollm2_path: Path, tmp_path: Path) -> None:
    record = ModelRecord(id="smollm2", path=str(smollm2_path), capabilities=["chat", "embeddings"])
    for mb, expect in ((64, True), (0, False)):
        settings = Settings(data_dir=tmp_path / f"data-{mb}", n_ctx=1024, n_parallel=2, prompt_cache_disk_mb=mb)
        engine = load_engine(record, settings)
        try:
            assert isinstance(engine, LlamaEngine)
            assert (engine.prompt_cache is not None) is expect
            if engine.prompt_cache is not None:
                assert engine.prompt_cache.max_bytes == 64 << 20
                assert engine.prompt_cache.dir.parent == settings.data_dir / "kv-cache"
                _serve(engine, MEDIUM)
        finally:
            engine.unload()
        assert bool(_files(settings.data_dir / "kv-cache")) is expect


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    for n in range(0, 40):
        a = list(range(40))
        b = [*a[:n], -1, *a[n + 1 :]]
        assert common_prefix(a, b) == n
