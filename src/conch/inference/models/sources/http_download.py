"""Streaming HTTP(S) download into a ``.part`` file, resumed with ``Range`` after a cut.

The partial file is kept when a transfer breaks, both within one call (a few retries, each
asking only for the missing bytes) and across calls (the next request for the same file
finds the ``.part`` and resumes it). The sha256 is computed while the bytes stream, so a
verified download costs no second pass over the file.

Throughput: the body is read straight into reusable buffers (``readinto``) and handed to a
writer thread and a hashing thread, so the socket read, the file write and sha256 run at
the same time (each releases the GIL). Requests go out through ``http.client`` unless a proxy
is configured for the URL, in which case httpx (which honours the proxy settings) carries it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import ssl
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from queue import Queue
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import httpx

from conch.inference.models.files import ProgressCallback
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    report,
)

CHUNK = 1 << 20
BUFFERS = 8
MAX_ATTEMPTS = 5
MAX_REDIRECTS = 8
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_TIMEOUT_S = 30.0
_TRANSPORT_ERRORS = (httpx.TransportError, OSError, http.client.HTTPException)


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


class _Response(Protocol):
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names

    def readinto(self, buf: memoryview) -> int: ...

    def close(self) -> None: ...


class _DirectResponse:
    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.status = resp.status
        self.reason = resp.reason
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    def readinto(self, buf: memoryview) -> int:
        return self._resp.readinto(buf)

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


class _HttpxResponse:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.reason = resp.reason_phrase
        self.headers = {k.lower(): v for k, v in resp.headers.items()}
        self._it: Iterator[bytes] = resp.iter_raw()
        self._pending = b""

    def readinto(self, buf: memoryview) -> int:
        if not self._pending:
            self._pending = next(self._it, b"")
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._resp.close()


def _uses_proxy(url: str) -> bool:
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def _open_direct(url: str, headers: dict[str, str]) -> _Response:
    for _ in range(MAX_REDIRECTS):
        parts = urlsplit(url)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=_TIMEOUT_S,
                                               context=ssl.create_default_context())
        elif parts.scheme == "http":
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=_TIMEOUT_S)
        else:
            raise errors.SourceUnreachable(f"unsupported URL scheme in {url}")
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        hdrs = {"User-Agent": "conch", "Accept-Encoding": "identity", **headers}
        if parts.username or parts.password:
            raise errors.SourceUnreachable("credentials in URLs are not supported")
        conn.request("GET", target, headers=hdrs)
        resp = conn.getresponse()
        if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
            location = urljoin(url, resp.getheader("Location") or "")
            resp.read()
            conn.close()
            if urlsplit(location).netloc != parts.netloc:
                # A redirect to another host (a CDN) must not carry our credentials along.
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            url = location
            continue
        return _DirectResponse(conn, resp)
    raise errors.SourceUnreachable(f"too many redirects for {url}")


def _open(url: str, headers: dict[str, str], client: httpx.Client | None) -> _Response:
    if client is None and not _uses_proxy(url):
        return _open_direct(url, headers)
    http_client = client or httpx.Client(timeout=TIMEOUT, follow_redirects=True)
    req = http_client.build_request("GET", url, headers=headers)
    resp = http_client.send(req, stream=True)
    return _HttpxResponse(resp)


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
    appears; on a mismatch the partial file is removed, so a retry starts afresh. ``client``
    forces httpx (for callers that configured one, e.g. with auth).
    """
    part = part or dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected_sha = sha256.lower() if sha256 else None
    digest = _download(client, url, part, dict(headers or {}), size, progress, status, max_attempts)
    if expected_sha and digest != expected_sha:
        part.unlink(missing_ok=True)
        raise errors.VerificationFailed(f"sha256 mismatch for {url}: expected {expected_sha}, got {digest}")
    os.replace(part, dest)
    return digest


def _hash_file(path: Path) -> Any:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(8 * CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h


def _download(
    client: httpx.Client | None,
    url: str,
    part: Path,
    headers: dict[str, str],
    size: int | None,
    progress: ProgressCallback | None,
    status: str,
    max_attempts: int,
) -> str:
    total = size
    hasher: Any = None
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
            resp = _open(url, req_headers, client)
            try:
                if resp.status == 416 and have:
                    # The server has nothing past what we hold: the part is complete, or stale.
                    if total is None or have == total:
                        total = have
                        break
                    part.unlink()
                    continue
                if resp.status in (401, 403, 404):
                    raise errors.NotFound(f"{url} answered {resp.status} {resp.reason}")
                if resp.status >= 400:
                    raise errors.SourceUnreachable(f"{_host(url)} answered {resp.status} {resp.reason} for {url}")
                if have and resp.status == 206:
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
                    hasher = _hash_file(part) if have else hashlib.sha256()
                    hashed = have
                report(progress, status, have, total or 0)
                try:
                    _stream_body(resp, part, mode, have, total, progress, status, hasher)
                finally:
                    hashed = part.stat().st_size if part.exists() else 0
            finally:
                resp.close()
            have = part.stat().st_size
            if total is None or have >= total:
                total = have
                break
            raise http.client.IncompleteRead(b"", (total or 0) - have)
        except _TRANSPORT_ERRORS as exc:
            last_error = exc
            now = part.stat().st_size if part.exists() else 0
            attempts_without_progress = 0 if now > start else attempts_without_progress + 1
            continue
    else:
        raise errors.SourceUnreachable(f"cannot download {url} from {_host(url)}: {last_error!r}")

    if hasher is None or hashed != part.stat().st_size:
        # Nothing streamed in this call (the part was already whole): hash what is on disk.
        hasher = _hash_file(part)
    digest: str = hasher.hexdigest()
    if total is not None and part.stat().st_size != total:
        part.unlink(missing_ok=True)
        raise errors.VerificationFailed(f"size mismatch for {url}: expected {total} bytes")
    report(progress, status, total or 0, total or 0)
    return digest


def _stream_body(
    resp: _Response,
    part: Path,
    mode: str,
    have: int,
    total: int | None,
    progress: ProgressCallback | None,
    status: str,
    hasher: Any,
) -> None:
    """Read the body into a ring of buffers; a writer and a hasher thread consume them.

    Whatever was read before an error is still written and hashed before this returns, so
    the part file and the hash always agree and a retry resumes exactly where the data ends.
    """
    free: Queue[bytearray] = Queue()
    for _ in range(BUFFERS):
        free.put(bytearray(CHUNK))
    to_write: Queue[tuple[bytearray, int] | None] = Queue()
    to_hash: Queue[tuple[bytearray, int] | None] = Queue()
    failure: list[BaseException] = []

    def writer(f: Any) -> None:
        try:
            while (item := to_write.get()) is not None:
                buf, n = item
                if not failure:
                    f.write(memoryview(buf)[:n])
                to_hash.put(item)
        except BaseException as exc:
            failure.append(exc)
            while (item := to_write.get()) is not None:
                to_hash.put(item)
        finally:
            to_hash.put(None)

    def hash_worker() -> None:
        while (item := to_hash.get()) is not None:
            buf, n = item
            if not failure:
                hasher.update(memoryview(buf)[:n])
            free.put(buf)

    step = max((total or 0) // 200, 4 * CHUNK)
    next_report = have + step
    with open(part, mode) as f:
        threads = [threading.Thread(target=writer, args=(f,), daemon=True),
                   threading.Thread(target=hash_worker, daemon=True)]
        for t in threads:
            t.start()
        try:
            while not failure:
                buf = free.get()
                n = _read_full(resp, buf)
                if n == 0:
                    free.put(buf)
                    break
                to_write.put((buf, n))
                have += n
                if progress is not None and have >= next_report:
                    report(progress, status, have, total or 0)
                    next_report = have + step
        finally:
            to_write.put(None)
            for t in threads:
                t.join()
    if failure:
        raise failure[0]


def _read_full(resp: _Response, buf: bytearray) -> int:
    """Fill ``buf`` as far as the body allows; a short count means the body ended (or broke,
    in which case the bytes read so far are returned first and the error comes next call)."""
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        try:
            n = resp.readinto(view[got:])
        except _TRANSPORT_ERRORS:
            if got:
                return got
            raise
        if not n:
            break
        got += n
    return got
