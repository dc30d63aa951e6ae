"""A file or directory on the server's machine, hard-linked (or copied) into the staging area."""

from __future__ import annotations

from pathlib import Path

from conch.inference.models.files import ProgressCallback
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    FetchRequest,
    FetchResult,
    is_mmproj,
    pick_mmproj,
    place_file,
    report,
    staged_result,
)

NAME = "file"


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None) -> FetchResult:
    raw = request.path or request.model_id
    src = Path(raw).expanduser()
    if not src.is_absolute():
        raise errors.BadRequest(f"the file source needs an absolute `path`; got {raw!r}")
    if not src.exists():
        raise errors.NotFound(f"no such file or directory: {src}")
    if src.is_file():
        sources = [(src, src.name)]
        # A vision model's projector beside it comes along (llama.cpp's mmproj-*.gguf naming).
        if src.suffix == ".gguf" and not is_mmproj(src.name):
            beside = pick_mmproj(sorted(p.name for p in src.parent.glob("*.gguf")))
            if beside:
                sources.append((src.parent / beside, beside))
    else:
        sources = [(p, str(p.relative_to(src))) for p in sorted(src.rglob("*")) if p.is_file()]
    total = sum(p.stat().st_size for p, _ in sources)
    done = 0
    report(progress, "copying", 0, total)
    for p, rel in sources:
        place_file(p, staging_dir / rel)
        done += p.stat().st_size
        report(progress, "copying", done, total)
    result = staged_result(staging_dir, request.revision, {"path": str(src)})
    if request.sha256 and result.sha256 and result.sha256 != request.sha256.lower():
        raise errors.VerificationFailed(
            f"sha256 mismatch for {src}: expected {request.sha256}, got {result.sha256}"
        )
    return result
