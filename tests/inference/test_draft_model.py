"""A draft model per model (``draft_model`` in ``[model_overrides.ID]``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import conch.inference.engines.llama.engine as le
from conch.config import Settings
from conch.inference.engines.base import EngineError, SamplingParams
from conch.inference.engines.llama.draft_model import check_same_vocab
from conch.inference.engines.llama.offload import EXACT_UBATCH, RuntimeOptions, runtime_options
from conch.inference.models.store import ModelRecord, ModelStore

Result = tuple[str, list[int], str | None]


def test_draft_model_is_read_from_the_model_overrides(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, model_overrides={"big": {"draft_model": "small"}})
    assert runtime_options(settings, "big", gpu_backend=False).draft_model == "small"
    assert runtime_options(settings, "other", gpu_backend=False).draft_model is None




# -- the draft model at work: the bundled model drafting for itself ---------------------------------

PROMPTS = [
    [{"role": "user", "content": "Name three colours of the rainbow and say one thing about each."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "What is 17 times 3? Explain step by step."}],
]


def _runtime(draft_id: str | None, draft_path: Path | None) -> RuntimeOptions:
    return RuntimeOptions(0, 0, "on", "f16", EXACT_UBATCH, 1024, False, draft_model=draft_id,
                          draft_path=str(draft_path) if draft_path else None)


@pytest.fixture(scope="module")
def engines(smollm2_path: Path) -> Iterator[tuple[le.LlamaEngine, le.LlamaEngine]]:
    drafted = le.LlamaEngine("drafted", str(smollm2_path), n_ctx=1024, n_parallel=2, draft_max=8,
                             runtime=_runtime("smollm2", smollm2_path))
    plain = le.LlamaEngine("plain", str(smollm2_path), n_ctx=1024, n_parallel=2, draft_max=0,
                           runtime=_runtime(None, None))
    drafted.load()
    plain.load()
    yield drafted, plain
    drafted.unload()
    plain.unload()


async def _collect(engine: le.LlamaEngine, messages: list[dict[str, str]], params: SamplingParams) -> Result:
    text, toks, reason = "", [], None
    async for ev in engine.generate(engine.format_chat(messages), params):  # type: ignore[arg-type]
        text += ev.text
        toks.extend(lp.token for lp in ev.logprobs or [])
        reason = ev.finish_reason or reason
    return text, toks, reason


def _run(engine: le.LlamaEngine, messages: list[dict[str, str]], params: SamplingParams) -> Result:
    return asyncio.run(_collect(engine, messages, params))


def test_the_draft_model_is_loaded_and_freed(smollm2_path: Path) -> None:
    engine = le.LlamaEngine("d", str(smollm2_path), n_ctx=256, n_parallel=1, draft_max=4,
                            runtime=_runtime("smollm2", smollm2_path))
    engine.load()
    try:
        assert engine.scheduler is not None and engine.scheduler.draft is not None
        assert engine._draft_model is not None and engine._draft_ctx is not None
    finally:
        engine.unload()
    assert engine._draft_model is None and engine._draft_ctx is None and not engine.loaded
    off = le.LlamaEngine("d", str(smollm2_path), n_ctx=256, n_parallel=1, draft_max=0,
                         runtime=_runtime("smollm2", smollm2_path))
    off.load()  # draft_max = 0: no drafting, so no draft model either
    try:
        assert off._draft_model is None and off.scheduler is not None and off.scheduler.draft is None
    finally:
        off.unload()


def test_greedy_output_is_identical_and_the_drafts_are_kept(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    drafted, plain = engines
    params = SamplingParams(max_tokens=60, temperature=0.0, logprobs=0)
    before = drafted.stats.draft_accepted_tokens, drafted.stats.draft_tokens
    for messages in PROMPTS:
        fast = _run(drafted, messages, params)
        assert fast == _run(plain, messages, params)
        assert len(fast[1]) > 10
    accepted = drafted.stats.draft_accepted_tokens - before[0]
    drafted_n = drafted.stats.draft_tokens - before[1]
    # The model drafting for itself: (nearly) every greedy draft is what the target draws.
    assert drafted_n > 60 and accepted >= 0.9 * drafted_n


@pytest.mark.parametrize("max_tokens", [1, 5, 19])
def test_a_token_budget_ends_inside_a_model_draft_as_without(
    engines: tuple[le.LlamaEngine, le.LlamaEngine], max_tokens: int
) -> None:
    drafted, plain = engines
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    fast = _run(drafted, PROMPTS[0], params)
    assert fast == _run(plain, PROMPTS[0], params)
    assert len(fast[1]) == max_tokens and fast[2] == "length"


def test_seeded_sampling_and_stop_strings_are_unchanged(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    drafted, plain = engines
    for seed in (1, 7):
        sampled = SamplingParams(max_tokens=60, temperature=0.8, top_p=0.95, seed=seed, logprobs=0)
        assert _run(drafted, PROMPTS[1], sampled) == _run(plain, PROMPTS[1], sampled)
    stop = SamplingParams(max_tokens=60, temperature=0.0, stop=["."], logprobs=0)
    assert _run(drafted, PROMPTS[2], stop) == _run(plain, PROMPTS[2], stop)


def test_concurrent_sequences_keep_identity(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    drafted, plain = engines
    params = SamplingParams(max_tokens=50, temperature=0.0, logprobs=0)
    expected = [_run(plain, m, params) for m in PROMPTS]

    async def together() -> list[Result]:
        # Three requests on two sequences: two draft side by side, the third waits for a free one.
        return list(await asyncio.gather(*(_collect(drafted, m, params) for m in PROMPTS)))

    assert asyncio.run(together()) == expected
    # Afterwards the draft context holds nothing of the finished requests.
    assert drafted.scheduler is not None and drafted.scheduler.draft is not None
    assert all(not drafted.scheduler.draft.held(seq) for seq in range(2))


def test_a_cancelled_sequence_clears_its_draft_cells(engines: tuple[le.LlamaEngine, le.LlamaEngine]) -> None:
    drafted, _ = engines
    assert drafted.scheduler is not None and drafted.scheduler.draft is not None
    draft = drafted.scheduler.draft

    async def cancel_early() -> bool:
        gen = drafted.generate(drafted.format_chat(PROMPTS[1]), SamplingParams(max_tokens=200, temperature=0.0))
        seen_cells = False
        async for _ in gen:
            seen_cells = seen_cells or any(draft.held(seq) for seq in range(2))
            if seen_cells:
                break  # the stream is closed: the request is cancelled
        for _ in range(500):
            if drafted.active_sequences == 0:
                break
            await asyncio.sleep(0.01)
        return seen_cells

    assert asyncio.run(cancel_early())
    assert drafted.active_sequences == 0
    assert all(not draft.held(seq) for seq in range(2))


def test_an_unknown_draft_model_is_a_clear_error(smollm2_path: Path) -> None:
    engine = le.LlamaEngine("big", str(smollm2_path), n_ctx=256, draft_max=8, runtime=_runtime("nope", None))
    with pytest.raises(EngineError, match=r"model_overrides\.big\.draft_model = 'nope': no ready local GGUF"):
        engine.load()
    assert not engine.loaded


def test_a_draft_model_is_looked_up_in_the_model_store(tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, model_overrides={"big": {"draft_model": "local:small"}})
    assert runtime_options(settings, "big", gpu_backend=False).draft_path is None
    ModelStore(settings).register(ModelRecord(id="small", path=str(smollm2_path)))
    assert runtime_options(settings, "big", gpu_backend=False).draft_path == str(smollm2_path)
    ModelStore(settings).register(ModelRecord(id="small", path=str(smollm2_path), status="downloading"))
    assert runtime_options(settings, "big", gpu_backend=False).draft_path is None


class _OtherVocab:
    """The bundled model's vocabulary with one token's text changed (a foreign tokenizer)."""

    def __init__(self, model: object, changed: int) -> None:
        self._model, self._changed = model, changed

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)

    def token_get_text(self, token: int) -> str:
        return "<other>" if token == self._changed else str(self._model.token_get_text(token))  # type: ignore[attr-defined]


def test_a_draft_model_with_another_vocabulary_is_refused(smollm2_path: Path) -> None:
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = LlamaModel(path_model=str(smollm2_path), params=params, verbose=False)
    try:
        check_same_vocab(model, model, name="same")  # the same vocabulary passes
        with pytest.raises(EngineError, match=r"vocabulary differs.*token 0"):
            check_same_vocab(model, _OtherVocab(model, 0), name="other")
        smaller = _OtherVocab(model, -1)
        smaller.n_vocab = lambda: 100  # type: ignore[method-assign]
        with pytest.raises(EngineError, match=r"draft_model 'other' .*vocabulary differs \(100 tokens"):
            check_same_vocab(model, smaller, name="other")
    finally:
        model.close()
