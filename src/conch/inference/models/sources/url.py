"""Any HTTP(S) file: streamed, resumed with ``Range`` after a cut, optionally sha256-checked."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from conch.inference.models.files import ProgressCallback
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    FetchRequest,
    FetchResult,
    detect_format,
    report,
)
from conch.inference.models.sources.http_download import download

NAME = "url"

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._+-]")


def file_name_for(url: str) -> str:
    name = PurePosixPath(unquote(urlsplit(url).path)).name
    name = _SAFE_NAME.sub("_", name).lstrip(".")
    return name or "model.gguf"


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None) -> FetchResult:
    url = request.url or request.model_id
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise errors.BadRequest(f"the url source needs an http:// or https:// `url`; got {url!r}")
    name = file_name_for(url)
    dest = staging_dir / name
    part = None
    if request.resume_dir is not None:
        key = hashlib.sha256(url.encode()).hexdigest()[:24]
        part = request.resume_dir / f"{key}.part"
    report(progress, f"downloading {name}")
    digest = download(
        url,
        dest,
        part=part,
        sha256=request.sha256,
        progress=progress,
        status=f"downloading {name}",
    )
    files = [name]
    fmt, main = detect_format(staging_dir, files)
    return FetchResult(files=files, revision=request.revision or digest, format=fmt, path=main,
                       sha256=digest, extra={"url": url})
