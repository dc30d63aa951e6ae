"""What downloads, conversions and the store share about files: progress reports and hashing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Called with {"status", "completed", "total"} as a long job goes; raising from it stops the job.
ProgressCallback = Callable[[dict[str, Any]], None]


def sha256_file(path: str | Path, chunk: int = 8 * 1024 * 1024) -> str:
    """Hex sha256 of a file, read in ``chunk``-byte blocks into one reused buffer."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()
