"""GGUF -> GGUF (re)quantization with llama.cpp's own quantizer (``llama_model_quantize``).

llama.cpp reports no progress while it quantizes, so progress is the size of the output file
against an estimate of its final size, sampled from a watcher thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import Any

from conch.inference.models.files import ProgressCallback

# conch name -> approximate bits per weight (for the progress estimate). The llama_ftype
# is llama.cpp's own constant of the same name, LLAMA_FTYPE_MOSTLY_<NAME> (ALL_F32 for f32).
BITS_PER_WEIGHT: dict[str, float] = {
    "q2_k": 2.6, "q3_k_m": 3.9, "q4_0": 4.5, "q4_1": 5.0, "q4_k_m": 4.9, "q5_0": 5.5,
    "q5_1": 6.0, "q5_k_m": 5.7, "q6_k": 6.6, "q8_0": 8.5, "f16": 16.0, "bf16": 16.0, "f32": 32.0,
}
# What a GGUF may be re-quantized to: the quantized types (not f16, bf16, f32).
REQUANT_TYPES = tuple(q for q in BITS_PER_WEIGHT if q.startswith("q"))


class QuantizeError(RuntimeError):
    pass


def quantize(
    src: str | Path,
    dst: str | Path,
    quantization: str,
    *,
    nthread: int | None = None,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write ``src`` quantized to ``quantization`` into ``dst`` (re-quantizing is allowed)."""
    q = quantization.lower()
    if q not in BITS_PER_WEIGHT:
        raise ValueError(f"unknown quantization {quantization!r}; supported: {', '.join(REQUANT_TYPES)}")
    import llama_cpp

    src = Path(src)
    dst = Path(dst)
    bits = BITS_PER_WEIGHT[q]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_ALL_F32" if q == "f32" else f"LLAMA_FTYPE_MOSTLY_{q.upper()}")
    params.nthread = nthread if nthread is not None else (os.cpu_count() or 1)
    params.allow_requantize = True

    stop = threading.Event()
    watcher: threading.Thread | None = None
    if progress is not None:
        status = f"quantizing to {q}"
        progress({"status": status, "completed": 0, "total": 0})

        def watch() -> None:
            # Estimated here, alongside the quantizer, so the progress bar costs it no time.
            estimate = _estimate_size(src, bits)
            while not stop.wait(0.25):
                try:
                    size = dst.stat().st_size
                except OSError:
                    size = 0
                with contextlib.suppress(Exception):  # a failing reporter must not kill the watch
                    progress({"status": status, "completed": min(size, estimate), "total": estimate})

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    try:
        # The call releases the GIL (ctypes), so the watcher keeps reporting meanwhile.
        rc = llama_cpp.llama_model_quantize(
            str(src).encode(), str(dst).encode(), ctypes.byref(params)
        )
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    if rc != 0 or not dst.is_file() or dst.stat().st_size == 0:
        raise QuantizeError(f"llama.cpp could not quantize {src.name} to {q} (code {rc})")
    if progress is not None:
        size = dst.stat().st_size
        progress({"status": f"quantizing to {q}", "completed": size, "total": size})
    return dst


def _estimate_size(src: Path, bits: float) -> int:
    """Expected output size: the parameter count (from the tensor table) times bits per weight."""
    try:
        params = count_parameters(src)
        return max(int(params * bits / 8), 1)
    except (OSError, ValueError, struct.error):
        return src.stat().st_size


# Sizes of GGUF scalar value types, by type id (strings and arrays are handled apart).
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def count_parameters(path: Path) -> int:
    """Sum of tensor element counts, read from the GGUF header alone.

    A hand-rolled walk over the header: gguf's reader maps every metadata value (a whole
    vocabulary of strings) into numpy objects, which takes seconds on a chat model.
    """
    with open(path, "rb") as f:
        data = f.read(4 * 1024 * 1024)
        pos = 0

        def need(n: int) -> None:
            nonlocal data
            while pos + n > len(data):
                more = f.read(max(n, 4 * 1024 * 1024))
                if not more:
                    raise ValueError("truncated GGUF header")
                data += more

        def take(fmt: str) -> Any:
            nonlocal pos
            size = struct.calcsize(fmt)
            need(size)
            value = struct.unpack_from(fmt, data, pos)
            pos += size
            return value[0]

        def skip_string() -> None:
            nonlocal pos
            n = take("<Q")
            need(n)
            pos += n

        def skip_value(vtype: int) -> None:
            nonlocal pos
            if vtype == 8:
                skip_string()
            elif vtype == 9:
                inner = take("<I")
                count = take("<Q")
                if inner == 8:
                    for _ in range(count):
                        skip_string()
                elif inner in _SCALAR:
                    need(_SCALAR[inner] * count)
                    pos += _SCALAR[inner] * count
                else:
                    for _ in range(count):
                        skip_value(inner)
            elif vtype in _SCALAR:
                need(_SCALAR[vtype])
                pos += _SCALAR[vtype]
            else:
                raise ValueError(f"unknown GGUF value type {vtype}")

        if take("<I") != 0x46554747:  # "GGUF"
            raise ValueError(f"{path} is not a GGUF file")
        take("<I")  # version
        n_tensors = take("<Q")
        n_kv = take("<Q")
        for _ in range(n_kv):
            skip_string()
            skip_value(take("<I"))
        total = 0
        for _ in range(n_tensors):
            skip_string()
            n_dims = take("<I")
            elements = 1
            for _ in range(n_dims):
                elements *= take("<Q")
            take("<I")  # type
            take("<Q")  # offset
            total += elements
        return total
