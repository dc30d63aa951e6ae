"""How much memory a llama.cpp model takes: estimated from its GGUF before loading, measured after.

A loaded model holds its weights (mapped from the file), the KV pool of its context (``n_ctx``
cells, allocated whole when the context is created) and llama.cpp's compute buffers (sized for
the largest micro-batch: the logits of ``n_ubatch`` rows dominate for small models). The model
manager budgets memory with :func:`estimate_footprint` before a load (and :func:`fit_context`
to lower a context that does not fit) and reads :attr:`LlamaEngine.footprint
<conch.inference.engines.llama.engine.LlamaEngine.footprint>` after it: the KV and compute
buffers as llama.cpp reported allocating them, the weights as llama.cpp counts its tensors.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from conch.inference.engines.llama.offload import ModelShape, RuntimeOptions, read_shape

# Contexts are sized in steps of llama.cpp's KV padding.
CTX_STEP = 256
# The smallest context fit_context offers (llama-server's fit keeps at least 4096 where it can).
MIN_FIT_CTX = 4096
# Host memory left to everything else when a default context is sized (llama-server's margin).
HOST_MARGIN = 1 << 30
_MIB = 1 << 20


@dataclass(frozen=True)
class Footprint:
    """Bytes one loaded model takes, by part; ``measured``: read from the load, not estimated."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    n_ctx: int
    measured: bool = False

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def compute_bytes(shape: ModelShape, n_ubatch: int, n_seqs: int = 1) -> int:
    """llama.cpp's compute buffers for micro-batches of ``n_ubatch`` rows, from above: the
    logits of every row, the widest activations (the FFN's), and the output rows it keeps.
    For SmolLM2-135M at 512 rows llama.cpp reported 98-103 MiB; this gives 107."""
    rows = max(1, n_ubatch)
    width = shape.n_vocab + 2 * shape.n_ff + 4 * shape.n_embd
    return 4 * rows * width + 4 * max(1, n_seqs) * shape.n_vocab


def resolve_n_ctx(requested: int, n_ctx_train: int) -> int:
    """The context a model gets: ``requested``, or its training context when 0, never more than
    its training context (as llama-server caps a slot's context)."""
    if requested <= 0:
        return n_ctx_train if n_ctx_train > 0 else 4096
    return min(requested, n_ctx_train) if n_ctx_train > 0 else requested


def estimate_footprint(path: str, opts: RuntimeOptions, *, n_ctx: int | None = None, n_seqs: int = 4,
                       draft_max: int = 0) -> Footprint | None:
    """What the model at ``path`` will take loaded with ``opts`` (its context ``n_ctx``, default
    the one ``opts`` resolves to), its draft model included; None when its GGUF cannot be read."""
    shape = read_shape(path)
    if shape is None:
        return None
    ctx = resolve_n_ctx(opts.n_ctx if n_ctx is None else n_ctx, shape.n_ctx_train)
    weights = shape.total_bytes
    kv = shape.kv_bytes(ctx, opts.kv_cache_type)
    compute = compute_bytes(shape, min(opts.n_ubatch, opts.n_batch), n_seqs)
    if opts.draft_model and opts.draft_path and draft_max:
        draft = read_shape(opts.draft_path)
        if draft is not None:
            weights += draft.total_bytes
            kv += draft.kv_bytes(ctx, opts.kv_cache_type)
            compute += compute_bytes(draft, min(opts.n_ubatch, opts.n_batch), n_seqs)
    return Footprint(weights, kv, compute, ctx)


def fit_context(path: str, opts: RuntimeOptions, budget_bytes: int, *, n_seqs: int = 4, draft_max: int = 0) -> int:
    """The largest context (a multiple of 256, at most the one ``opts`` asks for) whose estimate
    fits ``budget_bytes``; 0 when not even :data:`MIN_FIT_CTX` (or a smaller asked-for context)
    fits, or the GGUF cannot be read."""
    full = estimate_footprint(path, opts, n_seqs=n_seqs, draft_max=draft_max)
    if full is None:
        return 0
    if full.total_bytes <= budget_bytes:
        return full.n_ctx
    per_cell = full.kv_bytes / max(1, full.n_ctx)
    room = budget_bytes - (full.total_bytes - full.kv_bytes)
    ctx = int(room // per_cell) // CTX_STEP * CTX_STEP if per_cell > 0 else 0
    return ctx if ctx >= min(MIN_FIT_CTX, full.n_ctx) else 0


def host_memory_bytes() -> int | None:
    """The machine's memory (llama-server sizes a default context against its total)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def default_context(path: str, opts: RuntimeOptions, *, n_seqs: int = 4, draft_max: int = 0) -> int:
    """The context a model gets at ``n_ctx`` 0 on the CPU: its training context, lowered (to no
    less than :data:`MIN_FIT_CTX`) when model and KV would not fit the machine's memory less
    :data:`HOST_MARGIN`, as llama-server's ``--fit`` does; 0: the GGUF could not be read."""
    full = estimate_footprint(path, opts, n_ctx=0, n_seqs=n_seqs, draft_max=draft_max)
    if full is None:
        return 0
    memory = host_memory_bytes()
    if memory is None or full.total_bytes <= memory - HOST_MARGIN:
        return full.n_ctx
    fit = fit_context(path, replace(opts, n_ctx=0), memory - HOST_MARGIN, n_seqs=n_seqs, draft_max=draft_max)
    return max(fit, min(MIN_FIT_CTX, full.n_ctx))


# -- measured: llama.cpp's own report of what it allocated ---------------------------------------

_BUFFER = re.compile(r"(\S+)\s+(KV|compute|output) buffer size\s*=\s*([0-9.]+) MiB")


def buffers_from_log(lines: list[str]) -> tuple[int, int]:
    """KV bytes and compute bytes (output buffers counted with compute) in llama.cpp's log lines
    of a context's creation (``backend.llama_log``); (0, 0) where it reported none."""
    kv = compute = 0.0
    for line in "".join(lines).splitlines():
        m = _BUFFER.search(line)
        if m is None or "matches expectation" in line:
            continue
        mib = float(m.group(3))
        if m.group(2) == "KV":
            kv += mib
        else:
            compute += mib
    return int(kv * _MIB), int(compute * _MIB)
