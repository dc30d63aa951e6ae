"""Streaming HTTP(S) download into a ``.part`` file, resumed with ``Range`` after a cut.

The partial file is kept when a transfer breaks, both within one call (a few retries, each
asking only for the missing bytes) and across calls (the next request for the same file
finds the ``.part`` and resumes it). The sha256 is computed while the bytes stream, so a
verified download costs no second pass over the file.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from queue import Queue
from urllib.parse import urlsplit

import httpx

from conch.inference.sources.base import (
    NotFound,
    ProgressCallback,
    SourceUnreachable,
    VerificationFailed,
    report,
)

CHUNK = 1 << 20
MAX_ATTEMPTS = 5
TIMEOUT = httpx.Timeout(30.0, connect=10.0)


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


class _Hasher:
    """sha256 on a helper thread: hashlib releases the GIL, so hashing overlaps the socket reads."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._q: Queue[bytes | None] = Queue(maxsize=64)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._h.update(item)

    def update(self, data: bytes) -> None:
        self._q.put(data)

    def hexdigest(self) -> str:
        self._q.put(None)
        self._t.join()
        return self._h.hexdigest()


def _hash_existing(path: Path, hasher: _Hasher) -> None:
    with open(path, "rb") as f:
        while True:
            data = f.read(8 * CHUNK)
            if not data:
                return
            hasher.update(data)


def download(
    url: str,
    dest: Path,
    *,
    part: Path | None = None,
    headers: Mapping[str, str] | None = None,
    sha256: str | None = None,
    size: int | None = None,
    progress: ProgressCallback | None = None,
    status: str = "downloading",
    client: httpx.Client | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> str:
    """Download ``url`` to ``dest``; returns the file's sha256.

    ``sha256`` (when given) and ``size`` (or the server's length) are checked before ``dest``
    appears; on a mismatch the partial file is removed, so a retry starts afresh.
    """
    part = part or dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    own_client = client is None
    http = client or httpx.Client(timeout=TIMEOUT, follow_redirects=True)
    expected_sha = sha256.lower() if sha256 else None
    try:
        digest = _download(
            http, url, part, dict(headers or {}), size, progress, status, max_attempts
        )
    finally:
        if own_client:
            http.close()
    if expected_sha and digest != expected_sha:
        part.unlink(missing_ok=True)
        raise VerificationFailed(
            f"sha256 mismatch for {url}: expected {expected_sha}, got {digest}"
        )
    os.replace(part, dest)
    return digest


def _download(
    http: httpx.Client,
    url: str,
    part: Path,
    headers: dict[str, str],
    size: int | None,
    progress: ProgressCallback | None,
    status: str,
    max_attempts: int,
) -> str:
    total = size
    hasher: _Hasher | None = None
    hashed = 0  # bytes of the part file the hasher has seen
    last_error: Exception | None = None
    attempts_without_progress = 0
    while attempts_without_progress < max_attempts:
        have = part.stat().st_size if part.exists() else 0
        if total is not None and have == total:
            break
        if total is not None and have > total:
            part.unlink()
            have = 0
        req_headers = dict(headers)
        if have:
            req_headers["Range"] = f"bytes={have}-"
        start = have
        try:
            with http.stream("GET", url, headers=req_headers) as resp:
                if resp.status_code == 416 and have:
                    # The server has nothing past what we hold: the part is complete, or stale.
                    if total is None or have == total:
                        total = have
                        break
                    part.unlink()
                    continue
                if resp.status_code in (401, 403, 404):
                    raise NotFound(
                        f"{url} answered {resp.status_code} {resp.reason_phrase}"
                    )
                if resp.status_code >= 400:
                    raise SourceUnreachable(
                        f"{_host(url)} answered {resp.status_code} {resp.reason_phrase} for {url}"
                    )
                if have and resp.status_code == 206:
                    mode = "ab"
                    crange = resp.headers.get("content-range", "")
                    if "/" in crange and crange.rsplit("/", 1)[1].isdigit():
                        total = int(crange.rsplit("/", 1)[1])
                    elif resp.headers.get("content-length"):
                        total = have + int(resp.headers["content-length"])
                else:
                    # No range support (or a fresh start): the body is the whole file.
                    mode = "wb"
                    have = start = 0
                    if resp.headers.get("content-length") and "content-encoding" not in resp.headers:
                        total = int(resp.headers["content-length"])
                if hasher is None or hashed != have:
                    if hasher is not None:
                        hasher.hexdigest()  # ends its thread
                    hasher = _Hasher()
                    if have:
                        _hash_existing(part, hasher)
                    hashed = have
                report(progress, status, have, total or 0)
                try:
                    _stream_body(resp, part, mode, have, total, progress, status, hasher)
                finally:
                    hashed = part.stat().st_size if part.exists() else 0
            have = part.stat().st_size
            if total is None or have >= total:
                total = have
                break
            raise httpx.RemoteProtocolError("connection closed before the whole body arrived")
        except (httpx.TransportError, OSError) as exc:
            last_error = exc
            now = part.stat().st_size if part.exists() else 0
            attempts_without_progress = 0 if now > start else attempts_without_progress + 1
            continue
    else:
        raise SourceUnreachable(f"cannot download {url} from {_host(url)}: {last_error}")

    if hasher is None or hashed != part.stat().st_size:
        # Nothing streamed in this call (the part was already whole): hash what is on disk.
        if hasher is not None:
            hasher.hexdigest()
        hasher = _Hasher()
        _hash_existing(part, hasher)
    digest = hasher.hexdigest()
    if total is not None and part.stat().st_size != total:
        part.unlink(missing_ok=True)
        raise VerificationFailed(f"size mismatch for {url}: expected {total} bytes")
    report(progress, status, total or 0, total or 0)
    return digest


def _stream_body(
    resp: httpx.Response,
    part: Path,
    mode: str,
    have: int,
    total: int | None,
    progress: ProgressCallback | None,
    status: str,
    hasher: _Hasher,
) -> None:
    step = max((total or 0) // 200, 4 * CHUNK)
    next_report = have + step
    with open(part, mode) as f:
        # No re-chunking: bytes that arrived before a cut must reach the file, not a buffer.
        for data in resp.iter_raw():
            f.write(data)
            hasher.update(data)
            have += len(data)
            if progress is not None and have >= next_report:
                report(progress, status, have, total or 0)
                next_report = have + step
