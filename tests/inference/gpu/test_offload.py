"""Offload settings, the fit plan and the device report, on any machine (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.config import ModelOverrides, Settings
from conch.inference.engines.llama import device, offload
from conch.inference.engines.llama.offload import (
    CPU_BATCH,
    CPU_PREFILL_CHUNK,
    CPU_UBATCH,
    EXACT_UBATCH,
    GPU_BATCH,
    GPU_UBATCH,
    plan_offload,
    read_shape,
    runtime_options,
)


def test_defaults_follow_the_build() -> None:
    s = Settings()
    gpu = runtime_options(s, "m", gpu_backend=True)
    assert (gpu.n_gpu_layers, gpu.n_ubatch, gpu.on_gpu) == (-1, GPU_UBATCH, True)
    cpu = runtime_options(s, "m", gpu_backend=False)
    assert (cpu.n_gpu_layers, cpu.n_ubatch, cpu.on_gpu) == (0, CPU_UBATCH, False)
    # asking for layers without a GPU backend runs on the CPU
    forced = runtime_options(Settings(n_gpu_layers=99), "m", gpu_backend=False)
    assert (forced.n_gpu_layers, forced.n_ubatch) == (0, CPU_UBATCH)
    # n_gpu_layers = 0 on a GPU build: the CPU's micro-batch
    assert runtime_options(Settings(n_gpu_layers=0), "m", gpu_backend=True).n_ubatch == CPU_UBATCH
    # batch_invariant: the CPU's micro-batches under 64 rows (exact prefix reuse)
    exact = runtime_options(Settings(batch_invariant=True), "m", gpu_backend=False)
    assert (exact.n_ubatch, exact.batch_invariant) == (EXACT_UBATCH, True)
    assert runtime_options(Settings(n_gpu_layers=0, batch_invariant=True), "m", gpu_backend=True).n_ubatch == EXACT_UBATCH


def test_prompt_batch_follows_the_device() -> None:
    """llama-server's 2048 prompt tokens a step on a GPU, where a burst of prompts then takes
    one or two steps, and one micro-batch of prompt while others generate; 512 and 128 on the
    CPU, where a step's time grows with its tokens; a setting wins, per model too."""
    gpu = runtime_options(Settings(), "m", gpu_backend=True)
    assert (gpu.n_batch, gpu.prefill_chunk) == (GPU_BATCH, GPU_UBATCH)
    cpu = runtime_options(Settings(), "m", gpu_backend=False)
    assert (cpu.n_batch, cpu.prefill_chunk) == (CPU_BATCH, CPU_PREFILL_CHUNK)
    assert runtime_options(Settings(n_gpu_layers=0), "m", gpu_backend=True).n_batch == CPU_BATCH
    small = runtime_options(Settings(n_batch=256, n_ubatch=64), "m", gpu_backend=True)
    assert (small.n_batch, small.prefill_chunk) == (256, 64)
    tiny = Settings(model_overrides={"t": ModelOverrides(n_batch=100)})
    assert runtime_options(tiny, "t", gpu_backend=False).prefill_chunk == 100


def test_auto_flash_attention_on_the_cpu() -> None:
    """On the CPU ``auto`` is flash attention in llama-server's micro-batches of 512, under 64
    rows with ``batch_invariant`` (exact reuse); ``off`` takes 512 (exact too); a GPU leaves it
    to llama.cpp; a micro-batch set is kept."""
    cpu = runtime_options(Settings(), "m", gpu_backend=False)
    assert (cpu.flash_attn, cpu.n_ubatch) == ("on", CPU_UBATCH)
    exact = runtime_options(Settings(batch_invariant=True), "m", gpu_backend=False)
    assert (exact.flash_attn, exact.n_ubatch) == ("on", EXACT_UBATCH)
    per_model = Settings(model_overrides={"x": ModelOverrides(batch_invariant=True)})
    assert runtime_options(per_model, "x", gpu_backend=False).n_ubatch == EXACT_UBATCH
    assert runtime_options(per_model, "y", gpu_backend=False).n_ubatch == CPU_UBATCH
    off = runtime_options(Settings(flash_attn="off"), "m", gpu_backend=False)
    assert (off.flash_attn, off.n_ubatch) == ("off", CPU_UBATCH)
    assert runtime_options(Settings(), "m", gpu_backend=True).flash_attn == "auto"
    pinned = runtime_options(Settings(flash_attn="on", n_ubatch=256), "m", gpu_backend=False)
    assert (pinned.flash_attn, pinned.n_ubatch) == ("on", 256)


def test_per_model_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(
        flash_attn="on", kv_cache_type="q8_0", n_ctx=4096,
        model_overrides={"small": ModelOverrides(n_gpu_layers=0, n_ctx=1024, n_ubatch=32)},
    )
    small = runtime_options(s, "small", gpu_backend=True)
    assert (small.n_gpu_layers, small.n_ctx, small.n_ubatch, small.flash_attn, small.kv_cache_type) == (
        0, 1024, 32, "on", "q8_0")
    other = runtime_options(s, "other", gpu_backend=True)
    assert (other.n_gpu_layers, other.n_ctx, other.n_ubatch) == (-1, 4096, GPU_UBATCH)
    # the same from conch.toml and from the environment
    cfg = tmp_path / "conch.toml"
    cfg.write_text('n_gpu_layers = 10\n[model_overrides."big"]\nn_gpu_layers = 20\nkv_cache_type = "q8_0"\n')
    monkeypatch.setenv("CONCH_MODEL_OVERRIDES__tiny__N_GPU_LAYERS", "0")
    # (the file load_settings(cfg) would read, set so that it is restored after the test)
    monkeypatch.setattr("conch.config._config_file_for_load", cfg)
    loaded = Settings()
    assert runtime_options(loaded, "big", gpu_backend=True).n_gpu_layers == 20
    assert runtime_options(loaded, "tiny", gpu_backend=True).n_gpu_layers == 0
    assert runtime_options(loaded, "else", gpu_backend=True).n_gpu_layers == 10


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_type"):
        Settings(kv_cache_type="q4_0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="flash_attn"):
        Settings(flash_attn="sometimes")  # type: ignore[arg-type]


def test_shape_of_the_bundled_model(smollm2_path: Path) -> None:
    shape = read_shape(smollm2_path)
    assert shape is not None
    # SmolLM2-135M: 30 blocks, 3 KV heads of 64 for K and for V, tied embeddings
    assert (shape.n_layer, shape.kv_width) == (30, 3 * (64 + 64))
    assert shape.output_bytes > 0 and shape.layer_bytes > shape.output_bytes
    assert shape.kv_bytes(1000, "f16") == 1000 * 30 * 384 * 2
    assert shape.kv_bytes(1000, "q8_0") < shape.kv_bytes(1000, "f16")
    assert read_shape(smollm2_path.parent / "nope.gguf") is None


def test_plan_fits_partially_and_never_refuses(smollm2_path: Path) -> None:
    shape = read_shape(smollm2_path)
    assert shape is not None
    opts = runtime_options(Settings(), "m", gpu_backend=True)
    full = shape.need_bytes(shape.n_layer, 4096, "f16")
    roomy = plan_offload(opts, shape, 4096, full + 1, "CUDA0")
    assert roomy.fits and roomy.n_gpu_layers == -1
    tight = plan_offload(opts, shape, 4096, full - 10 * shape.layer_bytes // shape.n_layer, "CUDA0")
    assert not tight.fits and 0 < tight.n_gpu_layers < shape.n_layer
    assert f"{tight.n_gpu_layers} of 30 layers offloaded" in tight.reason
    assert shape.need_bytes(tight.n_gpu_layers, 4096, "f16") <= full - 10 * shape.layer_bytes // shape.n_layer
    none = plan_offload(opts, shape, 4096, 1024, "CUDA0")
    assert none.n_gpu_layers == 0 and "runs on the CPU" in none.reason
    unknown = plan_offload(opts, shape, 4096, None)
    assert unknown.n_gpu_layers == -1 and unknown.fits
    cpu = plan_offload(runtime_options(Settings(), "m", gpu_backend=False), shape, 4096, None)
    assert cpu.n_gpu_layers == 0 and "no GPU backend" in cpu.reason



def test_plan_leaves_room_for_the_draft_model(smollm2_path: Path) -> None:
    """A draft model is opened with the target's GPU layers and as many KV cells: the plan
    counts its weights and cache against the same free memory (once the margin)."""
    shape = read_shape(smollm2_path)
    assert shape is not None
    opts = runtime_options(
        Settings(model_overrides={"m": ModelOverrides(draft_model="d")}), "m", gpu_backend=True
    )
    alone = shape.need_bytes(shape.n_layer, 4096, "f16")
    both = alone + shape.need_bytes(shape.n_layer, 4096, "f16") - offload._MARGIN_BYTES
    # Room for the target alone: without the draft it fits, with it only some layers do.
    assert plan_offload(opts, shape, 4096, alone + 1, "CUDA0").fits
    squeezed = plan_offload(opts, shape, 4096, alone + 1, "CUDA0", draft=shape)
    assert not squeezed.fits and 0 < squeezed.n_gpu_layers < shape.n_layer
    assert "with its draft model d" in squeezed.reason
    roomy = plan_offload(opts, shape, 4096, both + 1, "CUDA0", draft=shape)
    assert roomy.fits and roomy.n_gpu_layers == -1
    assert "with its draft model d" in roomy.reason

def test_fallback_steps() -> None:
    assert list(offload.fallback_layers(-1, 24)) == [-1, 12, 6, 3, 1, 0]
    assert list(offload.fallback_layers(0, 24)) == [0]
    assert list(offload.fallback_layers(-1, None)) == [-1, 0]


def test_device_report_matches_the_build() -> None:
    info = device.device_info(fresh=True)
    data = info.as_dict()
    assert set(data) >= {"device", "backend", "gpu_offload", "memory_used_bytes", "memory_total_bytes", "gpus"}
    if not device.gpu_offload_supported():
        assert data["device"] == "cpu" and data["backend"] == "cpu" and data["gpus"] == []
    else:
        assert data["backend"] != "cpu"


def test_load_placed_on_the_cpu(smollm2_path: Path) -> None:
    opts = runtime_options(Settings(), "m", gpu_backend=False)
    tried: list[int] = []
    loaded, where = offload.load_placed("m", str(smollm2_path), opts, 1024, lambda n: tried.append(n) or "model")
    assert loaded == "model" and tried == [0]
    assert where.as_dict() == {"device": "cpu", "offload": "none", "n_gpu_layers": 0, "n_layers": None,
                               "vram_bytes": None, "note": "runs on the CPU (no GPU backend in this llama.cpp build)"}


def test_load_placed_falls_back_when_llama_cpp_cannot_allocate(
    smollm2_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry steps, driven by a loader that fails as llama.cpp does when a buffer does not fit
    (its model loader returns NULL, which llama-cpp-python raises as ValueError)."""
    opts = runtime_options(Settings(), "m", gpu_backend=True)
    tried: list[int] = []

    def load(n: int) -> str:
        tried.append(n)
        if n > 3 or n < 0:
            raise ValueError("Failed to load model from file")
        return f"model with {n}"

    loaded, where = offload.load_placed("m", str(smollm2_path), opts, 1024, load)
    assert tried == [-1, 15, 7, 3] and loaded == "model with 3"
    assert (where.n_gpu_layers, where.n_layers, where.offload) == (3, 30, "partial")
    assert "could not allocate it with 7 GPU layers" in where.note
    assert sum("retrying with" in r.getMessage() for r in caplog.records) == 3

    def never(n: int) -> str:
        raise ValueError("Failed to load model from file")

    with pytest.raises(ValueError):  # the CPU attempt's own error when nothing works
        offload.load_placed("m", str(smollm2_path), opts, 1024, never)


def test_gpu_shortfall_is_zero_on_the_cpu(smollm2_path: Path) -> None:
    """Without a GPU backend nothing is evicted for GPU memory (the manager's loop never runs)."""
    if device.gpu_offload_supported():
        pytest.skip("this llama.cpp has a GPU backend")
    assert offload.gpu_shortfall(Settings(), "m", str(smollm2_path)) == 0
