"""The memory budget's figures: how large the budget is, and what a model will take.

The budget (``memory_budget_mb``) is what the loaded models may hold together. By default it is
80 % of the memory free when the server starts, counted where the models live: the GPUs' free
memory when llama.cpp offloads models to a GPU (a GPU backend is compiled in and
``n_gpu_layers`` is not 0), else the RAM the kernel reports available (``MemAvailable``: free
memory plus the page cache it can drop). The other 20 % is left to the rest of the machine and
to what the estimates miss.

A model's footprint is estimated from its file before it loads
(:func:`conch.inference.models.gguf_info.estimate_footprint` with the context the engine will
ask for, :func:`conch.inference.engines.load.load_plan`) and measured when it has loaded
(:func:`conch.inference.engines.load.measuring`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.inference.engines.load import LoadPlan, load_plan
from conch.inference.models.gguf_info import (
    Footprint,
    GGUFShape,
    estimate_footprint,
    read_gguf_shape,
)
from conch.inference.models.store import ModelRecord

log = logging.getLogger(__name__)

DEFAULT_BUDGET_SHARE = 0.8
MB = 1 << 20


@dataclass(frozen=True)
class Budget:
    bytes: int
    basis: str  # where the figure came from, for the log and /v1/status


def mem_available_bytes() -> int | None:
    """The kernel's estimate of memory available to new work (``MemAvailable``), else free pages."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _gpu_free_bytes(settings: Settings) -> int | None:
    """The GPUs' free memory when models are offloaded to them by default, else None. Read
    through NVML or nvidia-smi where they answer (no CUDA context is made in this process)."""
    if settings.n_gpu_layers == 0:
        return None
    from conch.inference.engines.llama import device

    info = device.device_info()
    if not info.gpu_offload or not info.gpus:
        return None
    total, used = info.memory_total_bytes, info.memory_used_bytes
    if total is None:
        return None
    return max(0, total - (used or 0))


def default_budget(settings: Settings) -> Budget:
    """``memory_budget_mb`` when set, else 80 % of the free GPU memory or of the available RAM."""
    if settings.memory_budget_mb is not None:
        return Budget(max(0, settings.memory_budget_mb) * MB, "memory_budget_mb")
    gpu = _gpu_free_bytes(settings)
    if gpu is not None:
        return Budget(int(gpu * DEFAULT_BUDGET_SHARE), f"80 % of the GPUs' free memory at start ({gpu // MB} MB)")
    ram = mem_available_bytes()
    if ram is not None:
        return Budget(int(ram * DEFAULT_BUDGET_SHARE), f"80 % of the available RAM at start ({ram // MB} MB)")
    # Nothing to read: no budget beyond max_loaded_models (a platform without /proc or sysconf).
    return Budget(1 << 62, "unlimited (the free memory could not be read)")


@dataclass(frozen=True)
class Estimate:
    footprint: Footprint
    plan: LoadPlan | None  # None for a runtime other than llama.cpp

    @property
    def key(self) -> Any:
        """What the footprint depends on besides the file (a measured figure is kept under it)."""
        return self.plan


def estimate(record: ModelRecord, settings: Settings) -> Estimate:
    """What loading ``record`` with the current settings will take (reads the GGUF header)."""
    if record.format == "gguf":
        try:
            shape = _shape(record.path)
        except Exception as exc:  # a header gguf cannot read: llama.cpp's load will say what is wrong
            log.debug("no footprint estimate for %s: %s", record.id, exc)
            return Estimate(Footprint(_size_on_disk(record.path), 0, 0), None)
        plan = load_plan(record, settings, shape.n_ctx_train)
        return Estimate(estimate_footprint(shape, kv_cells=plan.kv_cells, n_ubatch=plan.n_ubatch,
                                           n_seq=plan.n_parallel, flash_attn=plan.flash_attn,
                                           kv_type=plan.kv_cache_type, n_ctx=plan.n_ctx), plan)
    # ONNX (onnxruntime): the weights, and its arena for activations, roughly a quarter more.
    weights = record.size_bytes or _size_on_disk(record.path)
    return Estimate(Footprint(weights, 0, weights // 4), None)


_shapes: dict[tuple[str, int, int], GGUFShape] = {}


def _shape(path: str) -> GGUFShape:
    """The file's shape, read once per version of the file (its header is read in ~0.2 s)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    shape = _shapes.get(key)
    if shape is None:
        shape = _shapes[key] = read_gguf_shape(path)
    return shape


def _size_on_disk(path: str) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def mb(n: int) -> str:
    """Bytes as whole MiB, the unit of ``memory_budget_mb``."""
    return f"{(n + MB // 2) // MB:,} MB"
