"""HTTP builtins: ``http_get``, ``http_post`` and ``http_request``, effect ``network``.

Each returns ``{status, headers, body}``: header names in lower case, the body parsed when
the response says it is JSON, else text. A status of 4xx or 5xx is a result, not an error
(the program decides); an unreachable host, a timeout or an over-long body is an error.

In the agent server ``network`` is off unless ``allow_network``; then private, loopback and
link-local addresses are refused unless ``network_allow`` lists them (redirects included,
see :mod:`conch.lang.netpolicy`), bodies are cut at ``http_max_bytes`` and a request takes
at most ``http_timeout_s``. In the shell every address is allowed.
"""

from __future__ import annotations

import json
import time

from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Number, Record, String
from conch.lang.context import current
from conch.lang.errors import ConchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

_UNREACHABLE = 'try { http_get("http://127.0.0.1:9/") } catch e { e.kind }'


def _request(name: str, method: str, url: str, body: Any = None, headers: Any = None,
             timeout: Any = None) -> dict[str, Any]:
    import httpx

    from conch.lang import netpolicy

    ctx = current()
    policy = netpolicy.policy_for(ctx.settings)
    method = method.upper()
    if method not in _METHODS:
        raise ConchError("ValueError", f"{name}: unknown method {method!r}",
                         hint=f"one of {', '.join(_METHODS)}")
    if not url.startswith(("http://", "https://")):
        raise ConchError("ValueError", f"{name}: {url!r} is not an http:// or https:// URL")
    limit = policy.timeout_s
    if timeout is not None:
        if timeout <= 0:
            raise ConchError("ValueError", f"{name}: timeout must be positive")
        # The shell takes the caller's timeout; the server's setting is a ceiling.
        limit = min(timeout, limit) if policy.restrict_private else timeout
    if ctx.deadline is not None:
        limit = min(limit, max(0.001, ctx.deadline - time.monotonic()))
    send_headers = {str(k): str(v) for k, v in (headers or {}).items()}
    content: bytes | None = None
    if body is not None:
        if isinstance(body, str):
            content = body.encode("utf-8")
            send_headers.setdefault("content-type", "text/plain; charset=utf-8")
        elif isinstance(body, bytes):
            content = body
        else:
            from conch.lang import values

            content = json.dumps(values.to_json_value(body), ensure_ascii=False).encode("utf-8")
            if not any(k.lower() == "content-type" for k in send_headers):
                send_headers["content-type"] = "application/json"
    ends = time.monotonic() + limit
    try:
        with netpolicy.client(policy, limit) as client, \
                client.stream(method, url, content=content, headers=send_headers) as response:
            data = bytearray()
            for part in response.iter_bytes():
                data += part
                if len(data) > policy.max_bytes:
                    raise ConchError(
                        "LimitError",
                        f"{name}: the response body from {url} is larger than "
                        f"{policy.max_bytes} bytes; it was cut off",
                        hint="the http_max_bytes setting is the limit",
                    )
                if time.monotonic() > ends:
                    raise httpx.ReadTimeout("the response did not finish in time")
            status = response.status_code
            out_headers: dict[str, str] = {}
            for key, value in response.headers.multi_items():
                key = key.lower()
                out_headers[key] = f"{out_headers[key]}, {value}" if key in out_headers else value
            ctype = response.headers.get("content-type", "")
            text = bytes(data).decode(response.encoding or "utf-8", errors="replace")
    except netpolicy.Refused as exc:
        raise netpolicy.refused_error(name, exc) from None
    except httpx.TimeoutException:
        raise ConchError("TimeoutError", f"{name}: {url} did not answer within {limit:g} s") from None
    except httpx.TooManyRedirects:
        raise ConchError("IOError", f"{name}: {url} redirected more than 5 times") from None
    except (httpx.HTTPError, httpcore_errors()) as exc:
        if _refused_by_kernel(exc):
            raise ConchError(
                "PermissionError",
                f"{name}: the sandbox refused the connection to {url}",
                hint="the server's allow_network and network_allow settings say what its "
                     "sandbox lets through",
            ) from None
        raise ConchError("IOError", f"{name}: request to {url} failed: {exc or type(exc).__name__}") from None
    parsed: Any = text
    if "json" in ctype and text.strip():
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
    return {"status": status, "headers": out_headers, "body": parsed}


def _refused_by_kernel(exc: BaseException) -> bool:
    """Whether a connection failed because the OS refused it (a sandbox's Landlock or
    seccomp layer), not the network: the error keeps the kind the language gives refusals."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, PermissionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def httpcore_errors() -> type[Exception]:
    import httpcore

    return httpcore.NetworkError


@builtin(
    "http_get",
    category="http",
    effect="network",
    description="GET a URL and return `{status, headers, body}` (body parsed when JSON, else "
    "text; header names lower-case). `timeout` in seconds. Off in the server unless it "
    "allows network; there private and loopback addresses are refused unless `network_allow` "
    "lists them.",
    examples=[
        Example(_UNREACHABLE, "IOError"),
        Example('try { http_get("ftp://example.com/") } catch e { e.kind }', "ValueError"),
    ],
)
def http_get(url: String, headers: Record | None = None, timeout: Number | None = None) -> Record:
    return _request("http_get", "GET", url, None, headers, timeout)


@builtin(
    "http_post",
    category="http",
    effect="network",
    description="POST `body` to a URL and return `{status, headers, body}`. A String is sent "
    "as text, any other value as JSON.",
    examples=[
        Example('try { http_post("http://127.0.0.1:9/", {name: "x"}) } catch e { e.kind }',
                "IOError"),
    ],
)
def http_post(url: String, body: Any = None, headers: Record | None = None,
              timeout: Number | None = None) -> Record:
    return _request("http_post", "POST", url, body, headers, timeout)


@builtin(
    "http_request",
    category="http",
    effect="network",
    description="Send a request with any method (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) "
    "and return `{status, headers, body}`.",
    examples=[
        Example('try { http_request("BREW", "http://127.0.0.1:9/") } catch e { e.message }',
                "http_request: unknown method 'BREW'"),
    ],
)
def http_request(method: String, url: String, body: Any = None, headers: Record | None = None,
                 timeout: Number | None = None) -> Record:
    return _request("http_request", method, url, body, headers, timeout)
