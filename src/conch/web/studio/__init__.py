"""conch studio: the web app, served from the bundle built out of ``ui/`` (``make ui``).

``mount_studio(app, pages)`` adds two ASGI layers in front of a server app:

- the studio itself: ``index.html`` at ``/`` (for browsers, i.e. when ``Accept`` names
  ``text/html``, so API clients asking ``/`` keep getting what the server answered before)
  and the content-hashed assets under ``/studio/assets/`` with a one-year immutable cache,
  gzip-compressed once at start. The bundle is public code, so these paths need no API key;
  every API route keeps its guard. On a loopback bind a non-loopback ``Host`` is not served
  (the request falls through to the app and its own DNS-rebinding guard);
- CORS for the app's own origins only: the agent server's and the inference server's
  addresses, so that the studio served by one can call the other (the agent server's studio
  calls the inference server for chat, models and status). Preflights are answered before
  the API-key check, as browsers send them without credentials.

The page config (which pages this server has, where the inference server is) is inlined into
``index.html``, so the first paint needs no extra request.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from conch.web.common.security import host_name, is_loopback

DIST = Path(__file__).parent / "dist"
PREFIX = "/studio/"
ALL_PAGES = frozenset({"playground", "chat", "models", "agents", "marketplace", "status"})
INFERENCE_PAGES = frozenset({"chat", "models", "status"})
# Pages that call the agent server's API; a server offering none of them is the inference server.
_AGENT_PAGES = frozenset({"playground", "agents", "marketplace"})
# The build's inputs, hashed into dist/studio-manifest.json by ui/scripts/stamp.mjs.
SOURCE_INPUTS = (
    "src",
    "index.html",
    "package.json",
    "package-lock.json",
    "vite.config.ts",
    "tsconfig.json",
)
_IMMUTABLE = b"public, max-age=31536000, immutable"


def source_hash(ui_dir: Path) -> tuple[str, int]:
    """sha256 over the build inputs under ``ui_dir``, as ui/scripts/stamp.mjs computes it."""
    files: list[Path] = []
    for name in SOURCE_INPUTS:
        p = ui_dir / name
        files.extend(sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])
    rels = sorted(f.relative_to(ui_dir).as_posix() for f in files)
    total = hashlib.sha256()
    for rel in rels:
        digest = hashlib.sha256((ui_dir / rel).read_bytes()).hexdigest()
        total.update(f"{rel}\0{digest}\n".encode())
    return total.hexdigest(), len(rels)


def _origin_host(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def studio_origins(settings: Any) -> list[str]:
    """The origins the studio can be served from: both servers' addresses, and every loopback
    name for them when they are bound to loopback."""
    origins: list[str] = []
    for host, port in ((settings.host, settings.port), (settings.models_host, settings.models_port)):
        names = ["127.0.0.1", "localhost", "::1"] if is_loopback(host) else [host]
        for name in names:
            origin = f"http://{_origin_host(name)}:{port}"
            if origin not in origins:
                origins.append(origin)
    return origins


@dataclass(frozen=True)
class _Asset:
    body: bytes
    gz: bytes
    content_type: bytes


class StudioMiddleware:
    """Serves the studio's index and assets; everything else goes to the app."""

    def __init__(self, app: ASGIApp, *, dist: Path, pages: Iterable[str], settings: Any) -> None:
        self.app = app
        self.settings = settings
        self.loopback_only = is_loopback(settings.host if _AGENT_PAGES & set(pages) else settings.models_host)
        self.assets: dict[str, _Asset] = {}
        for f in sorted(dist.rglob("*")):
            rel = f.relative_to(dist).as_posix()
            if f.is_file() and rel != "index.html":
                self.assets[PREFIX + rel] = _asset(f.read_bytes(), rel)
        self.agent = bool(_AGENT_PAGES & set(pages))
        from conch import __version__

        config = {
            "pages": sorted(set(pages) & ALL_PAGES),
            "server": "agent" if self.agent else "inference",
            "inference_port": settings.models_port if self.agent else None,
            "version": __version__,
        }
        # "<" escaped so that nothing in the JSON can close the script element.
        inline = json.dumps(config).replace("<", "\\u003c")
        tag = f'<script id="conch-config" type="application/json">{inline}</script>'
        template = (dist / "index.html").read_text("utf-8")
        if "<!--conch-config-->" not in template:
            raise RuntimeError("the studio bundle's index.html has no config placeholder; run `make ui`")
        self.index = _asset(template.replace("<!--conch-config-->", tag).encode(), "index.html")

    def _csp(self, host: str) -> bytes:
        connect = ["'self'"]
        if self.agent:
            # The inference server, as the page reaches it: this host name, its port.
            connect.append(f"http://{_origin_host(host)}:{self.settings.models_port}")
        return (
            "default-src 'self'; script-src 'self'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            f"connect-src {' '.join(connect)}; object-src 'none'; base-uri 'none'; "
            "frame-ancestors 'none'; form-action 'none'"
        ).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path not in ("/", "/studio", PREFIX) and not path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = host_name(headers.get(b"host", b"").decode("latin-1").strip())
        if self.loopback_only and host and not is_loopback(host):
            await self.app(scope, receive, send)  # the app's own guard answers
            return
        if path.startswith(PREFIX) and path != PREFIX:
            asset = self.assets.get(path)
            if asset is None:
                await _send(send, scope, 404, b"not found", b"text/plain; charset=utf-8", [])
                return
            await self._serve(scope, send, headers, asset, [(b"cache-control", _IMMUTABLE)])
            return
        if path == "/" and b"text/html" not in headers.get(b"accept", b""):
            await self.app(scope, receive, send)  # an API client asking "/"
            return
        extra = [
            (b"cache-control", b"no-cache"),
            (b"content-security-policy", self._csp(host or "127.0.0.1")),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
        ]
        await self._serve(scope, send, headers, self.index, extra)

    async def _serve(
        self,
        scope: Scope,
        send: Send,
        headers: dict[bytes, bytes],
        asset: _Asset,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        gz = b"gzip" in headers.get(b"accept-encoding", b"") and len(asset.gz) < len(asset.body)
        body = asset.gz if gz else asset.body
        out = [*extra, (b"vary", b"accept-encoding")]
        if gz:
            out.append((b"content-encoding", b"gzip"))
        await _send(send, scope, 200, body, asset.content_type, out)


def _asset(body: bytes, name: str) -> _Asset:
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if kind.startswith("text/") or kind in ("application/javascript", "application/json", "image/svg+xml"):
        kind += "; charset=utf-8"
    # mtime=0: the same bytes every start, so a cache or a test sees a stable body.
    return _Asset(body, gzip.compress(body, 9, mtime=0), kind.encode())


async def _send(
    send: Send,
    scope: Scope,
    status: int,
    body: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]],
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def mount_studio(app: Any, pages: set[str] | frozenset[str]) -> None:
    """Serve the studio's ``pages`` from ``app`` (which has ``app.state.settings``), and allow
    the studio's cross-origin calls between the two conch servers. Call it once, when the app
    is built. Without a built bundle (a source checkout before ``make ui``) it does nothing."""
    unknown = set(pages) - ALL_PAGES
    if unknown:
        raise ValueError(f"unknown studio pages: {sorted(unknown)}; known: {sorted(ALL_PAGES)}")
    if not (DIST / "index.html").is_file():
        return
    settings = app.state.settings
    app.add_middleware(StudioMiddleware, dist=DIST, pages=frozenset(pages), settings=settings)
    # CORS wraps the whole built stack, outside even Starlette's ServerErrorMiddleware (which
    # add_middleware cannot reach): preflights are answered before any API-key check, and an
    # unexpected error's 500 carries the CORS headers too, so the studio on the other server's
    # origin reads the error instead of "cannot reach".
    build = app.build_middleware_stack

    def build_with_cors() -> ASGIApp:
        return CORSMiddleware(
            build(),
            allow_origins=studio_origins(settings),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            # X-Conch-Poll: the studio marks its polling, left out of request rates
            # (conch.web.common.history).
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "Accept", "X-Conch-Poll"],
            max_age=600,
        )

    app.build_middleware_stack = build_with_cors
