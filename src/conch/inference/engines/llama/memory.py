"""What llama.cpp allocates for a model, as llama.cpp itself reports it.

llama.cpp logs every buffer it allocates while it opens a model or a context ("CPU_Mapped
model buffer size = 92.10 MiB", "CUDA0 KV buffer size = ...", "CPU compute buffer size =
..."), and its C API offers no other way to read those sizes. :func:`allocations` collects
the lines logged on the calling thread inside its block (llama.cpp logs from the thread that
allocates), so the model manager learns a model's measured footprint from the load it ran,
and what a context opened later (a chat model's embedding context) adds.

The log callback installed here replaces llama-cpp-python's (``llama_cpp._logger``) and keeps
what it did: print a line when the ``llama-cpp-python`` logger's level lets it through.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# "<device> <kind> buffer size = <n> MiB": kind is model, KV, RS, compute or output.
_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|compute|output)\s+buffer size\s*=\s*([0-9.]+)\s*MiB")
_LEVELS = {0: logging.CRITICAL, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.DEBUG}
_CONT = 5  # GGML_LOG_LEVEL_CONT: the previous line goes on

_local = threading.local()
_install_lock = threading.Lock()
_callback: Any = None
_last_level = logging.CRITICAL


@dataclass
class Allocations:
    """Bytes llama.cpp reported allocating, by kind (model, KV, compute, output) and device."""

    by_kind: dict[str, int] = field(default_factory=dict)
    device_bytes: int = 0  # on a GPU (any device that is not the host's)
    lines: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.by_kind.values())

    def add(self, device: str, kind: str, n_bytes: int) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n_bytes
        self.lines += 1
        # CPU, CPU_Mapped, CPU_REPACK, and the pinned host buffers a GPU backend uses (CUDA_Host).
        if not (device.startswith("CPU") or device.endswith("_Host")):
            self.device_bytes += n_bytes


def _on_log(level: int, text: bytes, _user: Any) -> None:
    global _last_level
    line = text.decode("utf-8", errors="replace")
    acc: Allocations | None = getattr(_local, "acc", None)
    if acc is not None and "buffer size" in line:
        m = _BUFFER.search(line)
        if m is not None:
            acc.add(m.group(1), m.group(2).lower(), int(float(m.group(3)) * 1024 * 1024))
    as_logging = _last_level if level == _CONT else _LEVELS.get(level, logging.DEBUG)
    # What llama-cpp-python's callback did: print what its logger's level lets through.
    if logging.getLogger("llama-cpp-python").level <= as_logging:
        print(line, end="", flush=True, file=sys.stderr)
    _last_level = as_logging


def _install() -> None:
    global _callback
    with _install_lock:
        if _callback is not None:
            return
        from conch.inference.engines.llama.backend import init_backend

        llama_cpp = init_backend()  # imports llama-cpp-python's callback first, so this one replaces it
        _callback = llama_cpp.llama_log_callback(_on_log)  # kept referenced: llama.cpp holds the pointer
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def allocations() -> Iterator[Allocations]:
    """The buffers llama.cpp allocates on this thread inside the block (nested blocks each see theirs)."""
    _install()
    acc = Allocations()
    outer: Allocations | None = getattr(_local, "acc", None)
    _local.acc = acc
    try:
        yield acc
    finally:
        _local.acc = outer
        if outer is not None:  # an enclosing block sees what the inner one saw
            for kind, n in acc.by_kind.items():
                outer.by_kind[kind] = outer.by_kind.get(kind, 0) + n
            outer.device_bytes += acc.device_bytes
            outer.lines += acc.lines
