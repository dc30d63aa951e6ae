"""The guard in front of a conch server: Host check, bearer key, body limit, headers.

A pure ASGI middleware (no per-request task or body buffering) so that it costs little on
the hot path and also covers streaming responses.

- On a loopback bind, a ``Host`` header that is not a loopback name is refused with ``403``:
  a web page whose DNS name was rebound to 127.0.0.1 must not reach the server.
- With an API key, every route but ``/health`` needs ``Authorization: Bearer <key>``
  (compared in constant time); otherwise ``401`` with ``WWW-Authenticate: Bearer``.
- Bodies larger than ``max_body_bytes`` are refused with ``413``, by ``Content-Length`` or
  while reading a chunked body; but for the requests ``body_exempt`` names (a file upload,
  which its route bounds by a limit of its own).
- Refusals are written with the server's own error-body builder
  (:mod:`conch.web.common.errors`), so each server answers in its family's envelope.
- Every response gets ``X-Content-Type-Options: nosniff``; API responses that did not choose
  their own caching (event streams use ``no-cache``) get ``Cache-Control: no-store``.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conch.web.common.errors import ErrorBody

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})
OPEN_PATHS = frozenset({"/health"})


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:3000`` → ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class ConfigurationError(Exception):
    """The server must not start with these settings."""


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to serve a non-loopback address without an API key."""
    if not is_loopback(host) and not api_key:
        raise ConfigurationError(
            f"refusing to bind {host}: a non-loopback address needs an API key "
            "(set api_key in conch.toml or CONCH_API_KEY)"
        )


class BodyTooLarge(HTTPException):
    """Raised while reading a body past the limit. An HTTPException so that the framework's
    body parsing passes it through as the ``413`` it is, instead of a generic parse error."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class SecurityMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        loopback_only: bool,
        max_body_bytes: int,
        error_body: ErrorBody,
        open_paths: frozenset[str] = OPEN_PATHS,
        body_exempt: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.app = app
        self.body_exempt = body_exempt
        self.error_body = error_body
        self.open_paths = open_paths
        self.key = f"Bearer {api_key}".encode() if api_key else None
        self.loopback_only = loopback_only
        self.max_body = max_body_bytes
        # Host header -> allowed; clients send the same few values, and parsing an address
        # on every request is a noticeable cost on the hot path.
        self._hosts: dict[bytes, bool] = {}

    def _host_allowed(self, host: bytes) -> bool:
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = is_loopback(host_name(host.decode("latin-1")))
            if len(self._hosts) < 256:
                self._hosts[host] = allowed
        return allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        path: str = scope["path"]
        if self.loopback_only:
            host = headers.get(b"host")
            if host is not None and not self._host_allowed(host):
                await self._reply(send, 403, "the Host header must name this machine (loopback)")
                return
        if self.key is not None and path not in self.open_paths:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.key):
                message = "missing bearer token" if not given else "invalid bearer token"
                await self._reply(
                    send, 401, message, [(b"www-authenticate", b'Bearer realm="conch"')]
                )
                return
        exempt = self.body_exempt is not None and self.body_exempt(scope["method"], path)
        length = headers.get(b"content-length")
        if length is not None and not exempt:
            try:
                too_large = int(length) > self.max_body
            except ValueError:
                await self._reply(send, 400, "invalid Content-Length header")
                return
            if too_large:
                await self._reply(send, 413, f"request body larger than {self.max_body} bytes")
                return

        api = path.startswith("/api/")
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                raw = list(message.get("headers", []))
                raw.append((b"x-content-type-options", b"nosniff"))
                if api and not any(k.lower() == b"cache-control" for k, _ in raw):
                    raw.append((b"cache-control", b"no-store"))
                message = {**message, "headers": raw}
            await send(message)

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        try:
            await self.app(scope, receive if exempt else limited_receive, send_with_headers)
        except BodyTooLarge:
            if not started:
                await self._reply(send, 413, f"request body larger than {self.max_body} bytes")

    async def _reply(
        self,
        send: Send,
        status: int,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        body = self.error_body(status, message)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"no-store"),
                    *(extra or []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
