"""The guard in front of a conch server: Host check, bearer key, body limit, headers.

A pure ASGI middleware (no per-request task or body buffering) so that it costs little on
the hot path and also covers streaming responses.

- On a loopback bind, a ``Host`` header that is not a loopback name is refused with ``403``:
  a web page whose DNS name was rebound to 127.0.0.1 must not reach the server.
- With keys (``access``, :mod:`conch.web.common.auth`), every request but those to the open
  paths is authenticated: its principal goes on the scope, or it is refused with ``401``
  and ``WWW-Authenticate: Bearer`` in the envelope of the API at its path (``render``).
  Without ``access``, a plain ``api_key`` is compared in constant time (a bare app's guard).
- Bodies larger than ``max_body_bytes`` are refused with ``413``, by ``Content-Length`` or
  while reading a chunked body (``None``: no limit, the inference server's choice); but for
  the requests ``body_exempt`` names (a file upload, which its route bounds by a limit of
  its own).
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

from conch.errors import DomainError, Unauthorized
from conch.web.common.auth import ACCESS, PRINCIPAL, WWW_AUTHENTICATE, KeyAccess, bearer
from conch.web.common.errors import ErrorBody

# How a server writes a refusal at a path (each API of the inference server has its own).
RenderError = Callable[[str, DomainError], bytes]

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


def check_bind(host: str, api_key: str | None, admin_key: str | None = None) -> None:
    """Refuse to serve a non-loopback address without an admin key (``admin_key`` or
    ``api_key``, which acts as one)."""
    if not is_loopback(host) and not (api_key or admin_key):
        raise ConfigurationError(
            f"refusing to bind {host}: a non-loopback address needs an API key "
            "(set admin_key or api_key in conch.toml, or CONCH_ADMIN_KEY)"
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
        max_body_bytes: int | None,
        error_body: ErrorBody,
        open_paths: frozenset[str] = OPEN_PATHS,
        open_prefixes: tuple[str, ...] = (),
        access: KeyAccess | None = None,
        render: RenderError | None = None,
        body_exempt: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.app = app
        self.body_exempt = body_exempt
        self.error_body = error_body
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.access = access
        self.render = render
        self.key = f"Bearer {api_key}".encode() if api_key and access is None else None
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
        if self.access is not None:
            scope[ACCESS] = self.access
        if self.access is not None and path not in self.open_paths and not (
            self.open_prefixes and path.startswith(self.open_prefixes)
        ):
            given = headers.get(b"authorization")
            secret = bearer(given)
            if secret is None and path.startswith("/v1/messages"):
                # Anthropic's clients send their key as x-api-key.
                raw = headers.get(b"x-api-key")
                secret = raw.decode("latin-1").strip() or None if raw else None
            found = self.access.authenticate(secret)
            if isinstance(found, str):
                if given and secret is None:
                    found = "the Authorization header must be 'Bearer <API key>'"
                await self._refuse(send, path, Unauthorized(found, headers=dict(WWW_AUTHENTICATE)))
                return
            scope[PRINCIPAL] = found
            if self.access.metrics is not None:
                self.access.metrics.request(found)
        elif self.key is not None and path not in self.open_paths:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.key):
                message = "missing bearer token" if not given else "invalid bearer token"
                await self._reply(
                    send, 401, message, [(b"www-authenticate", b'Bearer realm="conch"')]
                )
                return
        if self.max_body is None:  # no body limit here (the inference server)
            await self.app(scope, receive, self._with_headers(send, path))
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

        started = False
        send_with_headers = self._with_headers(send, path)

        async def first_send(message: Message) -> None:
            nonlocal started
            started = True
            await send_with_headers(message)

        received = 0
        limit = self.max_body

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        try:
            await self.app(scope, receive if exempt else limited_receive, first_send)
        except BodyTooLarge:
            if not started:
                await self._reply(send, 413, f"request body larger than {limit} bytes")

    @staticmethod
    def _with_headers(send: Send, path: str) -> Send:
        """``send`` adding ``nosniff`` to every response, and ``no-store`` to API responses
        that did not choose their own caching."""
        api = path.startswith("/api/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                raw.append((b"x-content-type-options", b"nosniff"))
                if api and not any(k.lower() == b"cache-control" for k, _ in raw):
                    raw.append((b"cache-control", b"no-store"))
                message = {**message, "headers": raw}
            await send(message)

        return send_with_headers

    async def _refuse(self, send: Send, path: str, exc: DomainError) -> None:
        if self.render is None:
            await self._reply(send, exc.status, exc.message, _raw(exc.headers))
            return
        body = self.render(path, exc)
        await self._send(send, exc.status, body, _raw(exc.headers))

    async def _reply(
        self,
        send: Send,
        status: int,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        await self._send(send, status, self.error_body(status, message), extra)

    async def _send(
        self, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
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


def _raw(headers: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
