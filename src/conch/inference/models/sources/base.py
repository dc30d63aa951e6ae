"""What every model source shares: the request, the result and progress reports.

A source only ever writes into the staging directory it is given (under ``<data_dir>/tmp``);
moving the result into the store is the caller's job, done once the files are complete and
verified. The errors sources raise live in :mod:`conch.inference.models.sources.errors`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from conch.inference.models.files import ProgressCallback, sha256_file
from conch.inference.models.sources import errors

# Files that make up a Hugging Face-style model directory (besides the weights).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)


@dataclass
class DownloadSpec:
    """What a caller asks to download: the source and its locator fields.

    The locator field of the chosen source (``repo``, ``url``, ``package``, ``name``, ``path``)
    defaults to the model id."""

    source: str
    revision: str | None = None
    files: list[str] | None = None  # glob patterns
    repo: str | None = None
    url: str | None = None
    package: str | None = None
    name: str | None = None
    path: str | None = None
    registry: str | None = None
    sha256: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class FetchRequest(DownloadSpec):
    """A download request as the sources see it: the caller's spec plus what the server adds."""

    model_id: str = ""
    endpoint: str | None = None
    token: str | None = None
    # Where a partial download may survive a failed attempt, so a retry resumes it.
    resume_dir: Path | None = None


@dataclass
class FetchResult:
    files: list[str]  # relative to the staging directory
    revision: str | None
    format: str  # gguf | safetensors | onnx
    path: str = ""  # main file relative to the staging directory ("" = the directory)
    sha256: str | None = None  # of the main file when it is a single file
    extra: dict[str, Any] = field(default_factory=dict)


def list_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# A vision model's projector, as llama.cpp's converters and the GGUF publishers name it
# (mmproj-model-f16.gguf, mmproj-F16.gguf, gemma-3-4b-it-mmproj-f16.gguf).
_MMPROJ_PREFERENCE = ("f16", "bf16", "q8_0", "f32")


def is_mmproj(name: str) -> bool:
    """Whether a GGUF file name is a vision projector's (``mmproj`` in its name)."""
    base = PurePosixPath(name).name.lower()
    return base.endswith(".gguf") and "mmproj" in base


def pick_mmproj(names: list[str]) -> str | None:
    """The projector to take of several (F16 first, as llama-server's ``-hf`` does; then BF16,
    Q8_0, F32, then the first by name); None when there is none."""
    found = sorted(n for n in names if is_mmproj(n))
    for pref in _MMPROJ_PREFERENCE:
        hits = [n for n in found if f"{pref}." in n.lower() or f"{pref}-" in n.lower() or f"-{pref}" in n.lower()]
        if hits:
            return hits[0]
    return found[0] if found else None


def detect_format(root: Path, files: list[str]) -> tuple[str, str]:
    """The format of a staged model and its main file (relative), from the files it has (a
    vision projector is never the main file)."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not is_mmproj(f))
    if ggufs:
        # Several GGUF files are shards of one model; llama.cpp opens the first.
        return "gguf", ggufs[0]
    if any(f.endswith(".safetensors") for f in files):
        return "safetensors", ""
    onnx = sorted(f for f in files if f.endswith(".onnx"))
    if onnx:
        return "onnx", ""
    names = ", ".join(files[:10]) or "nothing"
    raise errors.BadRequest(
        f"no model weights found (expected *.gguf, *.safetensors or *.onnx); got {names}"
    )


def staged_result(staging_dir: Path, revision: str | None, extra: dict[str, Any],
                  digests: Mapping[str, str] | None = None) -> FetchResult:
    """What is now staged, as a result: every file, the format and main file, and the main
    file's sha256 (from ``digests`` where the source already took it)."""
    files = list_files(staging_dir)
    fmt, main = detect_format(staging_dir, files)
    digest = ((digests or {}).get(main) or sha256_file(staging_dir / main)) if main else None
    return FetchResult(files=files, revision=revision, format=fmt, path=main, sha256=digest, extra=extra)


def report(progress: ProgressCallback | None, status: str, completed: int = 0, total: int = 0) -> None:
    if progress is not None:
        progress({"status": status, "completed": int(completed), "total": int(total)})


def place_file(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst``: a hard link when the filesystem allows it, else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
