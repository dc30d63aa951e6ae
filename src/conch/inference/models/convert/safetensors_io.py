"""Reading safetensors checkpoints without torch: the header is JSON, the data is mmapped.

bf16 has no numpy dtype; its 16 bits are the top half of a float32, so widening is a shift.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


@dataclass(frozen=True)
class TensorRef:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_index(path: Path) -> dict[str, TensorRef]:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > 100 * 1024 * 1024:
            raise ValueError(f"{path.name} is not a safetensors file (header of {header_len} bytes)")
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    out: dict[str, TensorRef] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = TensorRef(name, path, meta["dtype"], tuple(meta["shape"]), base + begin, base + end)
    return out


def index_dir(model_dir: Path) -> dict[str, TensorRef]:
    """All tensors of the checkpoint in ``model_dir`` (sharded or not)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}")
    tensors: dict[str, TensorRef] = {}
    for f in files:
        tensors.update(read_index(f))
    return tensors


class TensorLoader:
    """Loads tensors as float32 (or their integer type) from memory-mapped files."""

    def __init__(self) -> None:
        self._maps: dict[Path, np.memmap] = {}

    def _map(self, path: Path) -> np.memmap:
        m = self._maps.get(path)
        if m is None:
            m = np.memmap(path, dtype=np.uint8, mode="r")
            self._maps[path] = m
        return m

    def raw(self, ref: TensorRef) -> np.ndarray:
        dtype = _DTYPES.get(ref.dtype)
        if dtype is None:
            raise ValueError(f"tensor {ref.name} has unsupported dtype {ref.dtype}")
        buf = self._map(ref.file)[ref.start : ref.end]
        return buf.view(dtype).reshape(ref.shape)

    def float32(self, ref: TensorRef) -> np.ndarray:
        data = self.raw(ref)
        if ref.dtype == "BF16":
            return (data.astype(np.uint32) << 16).view(np.float32)
        if data.dtype == np.float32:
            return np.asarray(data)
        return data.astype(np.float32)

    def close(self) -> None:
        self._maps.clear()
