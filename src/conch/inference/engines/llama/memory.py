"""What llama.cpp allocates for a model, as llama.cpp itself reports it.

llama.cpp logs every buffer it allocates while it opens a model or a context ("CPU_Mapped
model buffer size = 92.10 MiB", "CUDA0 KV buffer size = ...", "CPU compute buffer size =
..."), and its C API offers no other way to read those sizes. :func:`allocations` collects
the lines logged on the calling thread inside its block (llama.cpp logs from the thread that
allocates; :func:`conch.inference.engines.llama.backend.llama_log` keeps them), so the model
manager learns a model's measured footprint from the load it ran, and what a context opened
later (a chat model's embedding context) adds.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from conch.inference.engines.llama.backend import llama_log

# "<device> <kind> buffer size = <n> MiB": kind is model, KV, RS, compute or output.
_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|compute|output)\s+buffer size\s*=\s*([0-9.]+)\s*MiB")


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


@contextlib.contextmanager
def allocations() -> Iterator[Allocations]:
    """The buffers llama.cpp allocates on this thread inside the block (filled as it ends; an
    enclosing block sees what the blocks inside it saw)."""
    acc = Allocations()
    with llama_log() as lines:
        yield acc
    for line in "".join(lines).splitlines():
        if "buffer size" in line:
            m = _BUFFER.search(line)
            if m is not None:
                acc.add(m.group(1), m.group(2).lower(), int(float(m.group(3)) * 1024 * 1024))
